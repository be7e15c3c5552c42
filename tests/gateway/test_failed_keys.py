"""401s rate-limited by address: a flood of bad keys gets 429s, never a valid key."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp
from hypothesis import given
from hypothesis import strategies as st

from gateway.catalog import Catalog
from gateway.config import GatewayConfig
from gateway.failed_keys import FAILURES_BURST, FailedKeys
from gateway.tenants import KeyTable, TenantLimits
from tests.gateway.engines import gateway_serving

BODY = {"model": "tiny", "prompt": "hi", "max_tokens": 1}


def test_a_burst_of_failures_then_one_a_second():
    keys = FailedKeys()
    assert [keys.failed("10.0.0.9", 0.0) for _ in range(int(FAILURES_BURST))] == [0.0] * 10
    assert keys.failed("10.0.0.9", 0.0) == 1.0  # the eleventh: wait a second
    assert keys.failed("10.0.0.8", 0.0) == 0.0  # another address is not affected
    assert keys.failed("10.0.0.9", 1.0) == 0.0
    assert keys.failed("10.0.0.9", 1.0) > 0


def test_memory_is_bounded_forgetting_the_least_recent_address():
    keys = FailedKeys(max_addresses=2)
    for _ in range(int(FAILURES_BURST)):
        keys.failed("a", 0.0)
    keys.failed("b", 0.0)
    keys.failed("c", 0.0)  # "a" is forgotten: it starts again with a full bucket
    assert keys.failed("a", 0.0) == 0.0


@given(st.lists(st.tuples(st.sampled_from("abc"), st.floats(0, 0.5)), max_size=200))
def test_no_address_gets_more_401s_than_its_burst_plus_its_refill(events):
    keys, now, allowed = FailedKeys(), 0.0, {}
    for address, step in events:
        now += step
        if keys.failed(address, now) == 0:
            allowed[address] = allowed.get(address, 0) + 1
    assert all(n <= FAILURES_BURST + now + 1e-9 for n in allowed.values())


def test_through_the_gateway_a_flood_of_bad_keys_turns_into_429s_and_a_valid_key_still_works():
    """No engine is needed: keys are checked before any routing."""

    async def run() -> tuple[list[int], str | None, int]:
        cfg = replace(GatewayConfig(), api_keys_secret="infergrid/keys")
        async with gateway_serving(Catalog(), cfg) as (gateway, url):
            gateway.keys = KeyTable.of({"sk-team-a-0123456789": TenantLimits("team-a")})
            gateway.clock = lambda: 100.0  # no refill between the calls, however slow
            async with aiohttp.ClientSession() as http:

                async def call(key: str) -> aiohttp.ClientResponse:
                    headers = {"Authorization": f"Bearer {key}"}
                    async with http.post(f"{url}/v1/completions", json=BODY,
                                         headers=headers) as resp:  # fmt: skip
                        await resp.read()
                        return resp

                bad = [await call("sk-guess-0000000000") for _ in range(12)]
                good = await call("sk-team-a-0123456789")
                return [r.status for r in bad], bad[-1].headers.get("Retry-After"), good.status

    statuses, retry_after, good = asyncio.run(run())
    assert statuses == [401] * 10 + [429] * 2
    assert retry_after == "1"
    assert good == 404  # past the key check: the model is not served
