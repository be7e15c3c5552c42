"""ContractError: what every caller prints for bad input."""

import pytest

from infergrid.errors import ContractError


def test_message_is_field_then_reason_and_parts_stay_readable():
    error = ContractError("gpus[2].memoryMiB", "must be at least 0, got -1")
    assert str(error) == "gpus[2].memoryMiB: must be at least 0, got -1"
    assert error.field == "gpus[2].memoryMiB"
    assert error.reason == "must be at least 0, got -1"


def test_is_a_value_error_so_generic_handlers_catch_it():
    with pytest.raises(ValueError):
        raise ContractError("x", "bad")
