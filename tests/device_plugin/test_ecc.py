"""The ECC rule: which records need a reset, which counts only count when they grow."""

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from device_plugin.ecc import KEPT_COUNTS, MEANING, NEEDS_RESET, EccFault, ecc_fault
from infergrid.fleet import FAKE_ECC
from infergrid.inventory import ECC_FIELDS, EccState

CLEAN = FAKE_ECC  # ECC on, every value supported, nothing wrong
FIELD = {key: name for key, name, _ in ECC_FIELDS}
BAD_VALUE = {int: 2, bool: True}
KIND = {key: kind for key, _, kind in ECC_FIELDS}


def test_every_value_is_judged_one_way_or_the_other_and_said_in_words():
    assert sorted(NEEDS_RESET + KEPT_COUNTS) == sorted(FIELD) == sorted(MEANING)


@pytest.mark.parametrize("first", [CLEAN, EccState()], ids=["clean", "no ecc"])
def test_a_clean_record_and_a_gpu_without_ecc_are_healthy(first):
    assert ecc_fault(first, first) is None


@pytest.mark.parametrize("key", NEEDS_RESET)
def test_each_value_that_needs_a_reset_needs_one_on_its_own(key):
    value = BAD_VALUE[KIND[key]]
    now = replace(CLEAN, **{FIELD[key]: value})
    shown = "true" if value is True else str(value)
    reason = f"ECC {key} is {shown} ({MEANING[key]})"
    assert ecc_fault(CLEAN, now) == EccFault(reason, needs_reset=True)


@pytest.mark.parametrize("key", NEEDS_RESET)
def test_a_value_that_needs_a_reset_needs_one_even_at_the_first_reading(key):
    """A plugin restarted without the reset must not forget the fault."""
    record = replace(CLEAN, **{FIELD[key]: BAD_VALUE[KIND[key]]})
    assert ecc_fault(record, record).needs_reset


@pytest.mark.parametrize("key", KEPT_COUNTS)
def test_a_kept_count_that_grew_is_a_fault_that_needs_no_reset(key):
    first = replace(CLEAN, **{FIELD[key]: 3})
    now = replace(CLEAN, **{FIELD[key]: 5})
    reason = f"ECC {key} grew from 3 to 5 since the plugin started ({MEANING[key]})"
    assert ecc_fault(first, now) == EccFault(reason, needs_reset=False)


@pytest.mark.parametrize("key", KEPT_COUNTS)
@pytest.mark.parametrize(("before", "after"), [(7, 7), (7, 0), (None, 4), (4, None)])
def test_a_kept_count_that_did_not_grow_or_is_not_supported_is_healthy(key, before, after):
    """Counts from before the plugin started (a reset GPU's history), counts cleared since
    (``nvidia-smi -p``), and counts NVML does not report are no fault."""
    first = replace(CLEAN, **{FIELD[key]: before})
    now = replace(CLEAN, **{FIELD[key]: after})
    assert ecc_fault(first, now) is None


def test_every_reason_is_named_and_any_that_needs_a_reset_makes_the_fault_need_one():
    first = replace(CLEAN, aggregate_double_bit=1)
    now = replace(CLEAN, aggregate_double_bit=2, remap_pending=True, remap_failed=True)
    assert ecc_fault(first, now) == EccFault(
        "ECC remapPending is true (a row waits to be remapped at the next reset); "
        "ECC remapFailed is true (a row could not be remapped); "
        "ECC aggregateDoubleBit grew from 1 to 2 since the plugin started "
        "(double-bit errors over the GPU's life)",
        needs_reset=True,
    )


def test_values_that_are_false_or_zero_or_unsupported_need_no_reset():
    now = EccState(0, None, None, False, None, None, False)
    assert ecc_fault(EccState(), now) is None


counts, flags = st.none() | st.integers(0, 2**40), st.none() | st.booleans()
records = st.builds(EccState, counts, counts, counts, flags, counts, flags, flags)


@given(records, records)
def test_the_rule_agrees_with_its_definition(first, now):
    reset = [key for key in NEEDS_RESET if getattr(now, FIELD[key])]
    grew = [
        key
        for key in KEPT_COUNTS
        if None not in (getattr(first, FIELD[key]), getattr(now, FIELD[key]))
        and getattr(now, FIELD[key]) > getattr(first, FIELD[key])
    ]
    fault = ecc_fault(first, now)
    if not reset and not grew:
        assert fault is None
        return
    assert fault.needs_reset == bool(reset)
    reasons = fault.reason.split("; ")
    assert [reason.split()[1] for reason in reasons] == reset + grew


@given(records)
def test_a_record_compared_with_itself_is_a_fault_only_where_it_needs_a_reset(record):
    fault = ecc_fault(record, record)
    assert fault is None or fault.needs_reset
