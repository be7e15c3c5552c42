"""Fixtures of the gateway's tests."""

from __future__ import annotations

import pytest

from tests.gateway.engines import start_engines


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """Two engine processes of the tiny model, one set per module that asks."""
    started = start_engines(tmp_path_factory.mktemp("engines"), 2)
    yield started
    for engine in started:
        engine.kill()
