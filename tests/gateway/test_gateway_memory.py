"""The gateway's memory under 32 hostile requests in flight (bench/gateway_memory.py): bodies
at the limit, deeply nested JSON, slow senders and 200 MiB answers. Its growth stays under
what the settings allow (`bound_mib`), where holding each answer whole would take 1.6 GiB."""

from __future__ import annotations

import pytest

from bench.gateway_memory import EACH, HUGE_ANSWER, HUGE_END, HUGE_HEAD, measure

pytestmark = pytest.mark.timeout(300)


def test_32_hostile_requests_in_flight_grow_the_gateway_by_less_than_its_settings_allow():
    figures = measure()
    assert figures.growth_mib < figures.bound_mib, figures
    whole = len(HUGE_HEAD) + HUGE_ANSWER + len(HUGE_END)
    assert figures.huge_bytes_received == [whole] * EACH  # relayed to the end
    assert figures.statuses["huge answer"] == {"200": EACH}
    assert set(figures.statuses["deeply nested"]) <= {"400", "429"}  # never parsed
    assert set(figures.statuses["body at the limit"]) <= {"200", "429"}
