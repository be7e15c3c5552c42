"""Request bodies a tenant has in the gateway at once are bounded (`tenantBodyBytes`), counted
as the bytes arrive: slow or many bodies of one tenant are refused once they hold its share,
and leave every other tenant's requests alone."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import aiohttp
import pytest
from aiohttp import web

from gateway.body_budget import BodyBudget
from gateway.catalog import Catalog
from gateway.config import GatewayConfig, check
from gateway.tenants import KeyTable, TenantLimits
from infergrid.errors import ContractError
from tests.gateway.engines import MODEL, gateway_serving, route
from tests.gateway.fake_pods import fake_pod

pytestmark = pytest.mark.timeout(60)
KEYS = {"sk-team-a-0123456789": TenantLimits("team-a"),
        "sk-team-b-0123456789": TenantLimits("team-b")}  # fmt: skip
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
SLOW_START = b'{"model": "tiny", "messages": [{"role": "user", "content": "' + b"x" * 4000


def test_a_lease_takes_up_to_the_budget_and_gives_everything_back_when_its_request_ends():
    budget = BodyBudget(per_tenant=100)
    with budget.lease("a") as first, budget.lease("a") as second:
        assert first.take(60) and not second.take(41) and second.take(40)
        assert second.refused and budget.held == {"a": 100}
        assert budget.lease("b").take(100)  # another tenant's share is its own
    assert budget.held == {"b": 100}


def test_a_tenants_share_smaller_than_one_body_is_refused_naming_the_setting():
    with pytest.raises(ContractError) as caught:
        check(GatewayConfig(api_keys_secret="infergrid/keys", max_body_bytes=8192,
                            tenant_body_bytes=4096))  # fmt: skip
    assert caught.value.field == "tenantBodyBytes"


async def answer(_request: web.Request, _body: dict) -> web.Response:
    return web.json_response({"choices": [], "usage": {"total_tokens": 1}})


def test_a_tenants_slow_bodies_hold_its_share_and_another_tenant_is_unaffected():
    async def run():
        cfg = replace(GatewayConfig(), api_keys_secret="infergrid/keys", max_body_bytes=4096,
                      tenant_body_bytes=8192)  # fmt: skip
        release = asyncio.Event()

        async def slow_body():
            yield SLOW_START
            await release.wait()
            yield b'"}]}'

        async with fake_pod(answer) as (pod, received):
            async with gateway_serving(Catalog.of(route([pod])), cfg) as (gateway, url):
                gateway.keys = KeyTable.of(KEYS)
                async with aiohttp.ClientSession() as http:

                    async def call(key, data):
                        headers = {"Authorization": f"Bearer {key}",
                                   "Content-Type": "application/json"}  # fmt: skip
                        async with http.post(f"{url}/v1/chat/completions", data=data,
                                             headers=headers) as resp:  # fmt: skip
                            return resp.status, await resp.json()

                    slow = [asyncio.ensure_future(call("sk-team-a-0123456789", slow_body()))
                            for _ in range(2)]  # fmt: skip
                    while gateway.bodies.held.get("team-a", 0) < 2 * len(SLOW_START):
                        await asyncio.sleep(0.01)
                    small = json.dumps(CHAT).encode()
                    a = await call("sk-team-a-0123456789", small)
                    b = await call("sk-team-b-0123456789", small)
                    release.set()
                    finished = await asyncio.gather(*slow)
                    return a, b, [s for s, _ in finished], dict(gateway.bodies.held), received

    a, b, finished, held, received = asyncio.run(run())
    status, doc = a
    assert (status, doc["error"]["param"]) == (429, "body")
    assert doc["error"]["code"] == "body_bytes_limit"
    assert "8192 bytes of request bodies" in doc["error"]["message"]
    assert b[0] == 200 and finished == [200, 200]
    assert held == {}  # every request's share came back
    assert len(received) == 3  # the refused one never reached the pod


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"[" * 5000, 413, "over the 4096-byte limit"),  # declared too large: never read
        (b"[" * 4000, 400, "JSON values"),  # deep nesting: refused before it is parsed
        (b'{"model": "tiny", "messages": [' + b"{}," * 1300 + b"{}]}", 400, "JSON values"),
    ],
)
def test_a_body_too_large_or_too_costly_to_parse_is_refused_naming_the_body(
    body, status, message, monkeypatch
):
    monkeypatch.setattr("gateway.request_body.PARSED_VALUES", 2048)

    async def run():
        cfg = replace(GatewayConfig(), max_body_bytes=4096)
        async with fake_pod(answer) as (pod, received):
            async with gateway_serving(Catalog.of(route([pod])), cfg) as (_, url):
                async with aiohttp.ClientSession() as http:
                    headers = {"Content-Type": "application/json"}
                    async with http.post(f"{url}/v1/chat/completions", data=body,
                                         headers=headers) as resp:  # fmt: skip
                        return resp.status, await resp.json(), received

    got, doc, received = asyncio.run(run())
    assert (got, doc["error"]["param"], received) == (status, "body", [])
    assert message in doc["error"]["message"]
