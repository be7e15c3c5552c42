"""Tenancy through the gateway over real HTTP: a model name squatted by another tenant, held
requests pinned to their service, scale from zero capped per tenant, the open gateway's
warning. Each engine's own /metrics tells whose pod answered."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp
import pytest

from gateway.catalog import Backend, Catalog, Route
from gateway.config import GatewayConfig
from gateway.tenants import KeyTable, TenantLimits
from tests.gateway.engines import MODEL, OPEN, gateway_serving, reached

pytestmark = pytest.mark.timeout(300)
KEY_A, KEY_B = "sk-team-a-0123456789", "sk-team-b-0123456789"
TEAM_A = TenantLimits("team-a", namespaces=frozenset({"team-a"}))
TEAM_B = TenantLimits("team-b", namespaces=frozenset({"team-b"}))
KEYED = replace(GatewayConfig(), api_keys_secret="infergrid/keys", hold_timeout_s=30)
BODY = {"model": MODEL, "prompt": "hi", "max_tokens": 1}


def victim(engine=None, replicas: int = 1) -> Route:
    """team-b's service `chat`, serving the engines' model; with `engine` as its ready pod."""
    pods = (Backend("team-b", "chat-5d4f7c9b8-bcdfg", engine.url, "stable"),) if engine else ()
    return Route(MODEL, "team-b", "chat", 0, replicas, pods)


def squatter(engine) -> Route:
    """team-a's service naming its model like team-b's."""
    return Route(MODEL, "team-a", "squat", 0, 1,
                 (Backend("team-a", "squat-5d4f7c9b8-bcdfg", engine.url, "stable"),))  # fmt: skip


async def post(http, url: str, key: str, model: str = MODEL) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    body = {**BODY, "model": model}
    async with http.post(f"{url}/v1/completions", json=body, headers=headers) as resp:
        return resp.status


async def listed(http, url: str, key: str) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}"}
    async with http.get(f"{url}/v1/models", headers=headers) as resp:
        return {m["id"]: m["owned_by"] for m in (await resp.json())["data"]}


def test_a_squatter_never_gets_the_victims_calls_while_the_victims_service_is_re_created(
    engines,
):
    squat_pod, victim_pod = engines

    async def run():
        async with gateway_serving(Catalog.of(victim(victim_pod), squatter(squat_pod)),
                                   KEYED) as (gateway, url):  # fmt: skip
            gateway.keys = KeyTable.of({KEY_A: TEAM_A, KEY_B: TEAM_B})
            async with aiohttp.ClientSession() as http:
                before = [await reached(http, e) for e in engines]
                seen = {"b": [await post(http, url, KEY_B), await post(http, url, KEY_B,
                                                                       "team-b/tiny")]}  # fmt: skip
                gateway.live.set(Catalog.of(victim(), squatter(squat_pod)))  # its pod goes
                held = asyncio.ensure_future(post(http, url, KEY_B))
                await asyncio.sleep(0.2)
                gateway.live.set(Catalog.of(squatter(squat_pod)))  # then the service
                seen["b held gone"] = [await held]
                seen["b"] += [await post(http, url, KEY_B), await post(http, url, KEY_B,
                                                                      "team-b/tiny")]  # fmt: skip
                gateway.live.set(Catalog.of(victim(), squatter(squat_pod)))  # re-created
                held = asyncio.ensure_future(post(http, url, KEY_B))
                await asyncio.sleep(0.2)
                gateway.live.set(Catalog.of(victim(victim_pod), squatter(squat_pod)))
                seen["b held ready"] = [await held, await post(http, url, KEY_B)]
                seen["a"] = [await post(http, url, KEY_A), await post(http, url, KEY_A,
                                                                      "team-b/tiny")]  # fmt: skip
                models = {"a": await listed(http, url, KEY_A), "b": await listed(http, url, KEY_B)}
                after = [await reached(http, e) for e in engines]
        return seen, models, [a - b for a, b in zip(after, before, strict=True)]

    seen, models, counts = asyncio.run(run())
    assert seen == {
        "b": [200, 200, 404, 404],
        "b held gone": [404],
        "b held ready": [200, 200],
        "a": [200, 404],
    }
    assert counts == [1, 4]  # the squatter's pod saw team-a's one call, and nothing else
    assert models == {"a": {"tiny": "team-a/squat", "team-a/tiny": "team-a/squat"},
                      "b": {"tiny": "team-b/chat", "team-b/tiny": "team-b/chat"}}  # fmt: skip


def test_a_name_served_in_two_namespaces_a_caller_may_call_is_ambiguous_until_qualified(
    engines,
):
    squat_pod, victim_pod = engines
    both = TenantLimits("ops", namespaces=frozenset({"team-a", "team-b"}))

    async def run():
        async with gateway_serving(Catalog.of(victim(victim_pod), squatter(squat_pod)),
                                   KEYED) as (gateway, url):  # fmt: skip
            gateway.keys = KeyTable.of({KEY_A: both})
            async with aiohttp.ClientSession() as http:
                headers = {"Authorization": f"Bearer {KEY_A}"}
                async with http.post(f"{url}/v1/completions", json=BODY,
                                     headers=headers) as resp:  # fmt: skip
                    ambiguous = resp.status, (await resp.json())["error"]
                before = await reached(http, victim_pod)
                qualified = await post(http, url, KEY_A, "team-b/tiny")
                return ambiguous, qualified, await reached(http, victim_pod) - before

    (status, error), qualified, victim_calls = asyncio.run(run())
    assert (status, error["param"], error["code"]) == (400, "model", "model_ambiguous")
    assert "team-a/tiny, team-b/tiny" in error["message"]
    assert (qualified, victim_calls) == (200, 1)


def test_a_held_request_stays_pinned_to_its_service_and_is_never_resolved_again(engines):
    """A caller of both namespaces asks for the one `tiny` there is, team-b's, which has no
    pod yet; team-b's service goes and team-a's squatter appears: the held request ends in
    a 404, and the squatter's pod never sees it."""
    squat_pod, _ = engines
    both = TenantLimits("ops", namespaces=frozenset({"team-a", "team-b"}))

    async def run():
        async with gateway_serving(Catalog.of(victim()), KEYED) as (gateway, url):
            gateway.keys = KeyTable.of({KEY_A: both})
            async with aiohttp.ClientSession() as http:
                before = await reached(http, squat_pod)
                held = asyncio.ensure_future(post(http, url, KEY_A))
                await asyncio.sleep(0.2)
                gateway.live.set(Catalog.of(squatter(squat_pod)))
                return await held, await reached(http, squat_pod) - before

    assert asyncio.run(run()) == (404, 0)


def test_a_tenant_wakes_at_most_its_cap_of_services_from_zero_at_once():
    asked = []
    limited = TenantLimits("team-a", max_scale_from_zero=1)
    catalog = Catalog.of(Route("chat", "team-a", "chat", 0, 0),
                         Route("embed", "team-a", "embed", 0, 0))  # fmt: skip

    async def scaler(namespace, name):
        asked.append((namespace, name))
        return True

    async def run():
        async with gateway_serving(catalog, KEYED, scaler) as (gateway, url):
            gateway.keys = KeyTable.of({KEY_A: limited, KEY_B: TEAM_B})
            async with aiohttp.ClientSession() as http:
                held = [asyncio.ensure_future(post(http, url, KEY_A, "chat")) for _ in range(2)]
                await asyncio.sleep(0.2)
                headers = {"Authorization": f"Bearer {KEY_A}"}
                body = {**BODY, "model": "embed"}
                async with http.post(f"{url}/v1/completions", json=body,
                                     headers=headers) as resp:  # fmt: skip
                    refused = resp.status, (await resp.json())["error"]
                gateway.live.set(Catalog())  # the held ones end (404); the slot is free
                ended = [await h for h in held]
                return refused, ended, gateway.wakes.held

    (status, error), ended, waking = asyncio.run(run())
    assert (status, error["code"]) == (429, "scale_from_zero_limit")
    assert "maxScaleFromZero" in error["message"]
    assert asked == [("team-a", "chat")]
    assert ended == [404, 404] and waking == {}


def test_an_open_gateway_says_so_in_readyz_and_a_keyed_one_does_not():
    async def run(cfg):
        async with gateway_serving(Catalog(), cfg) as (gateway, url):
            gateway.keys = KeyTable({})
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{url}/readyz") as resp:
                    return resp.status, await resp.json()

    status, body = asyncio.run(run(OPEN))
    assert status == 200 and "unauthenticated" in body["warning"]
    status, body = asyncio.run(run(KEYED))
    assert status == 200 and "warning" not in body
