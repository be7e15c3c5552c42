"""A tenant's bucket of model tokens, over real HTTP: each request reserves the most it can
cost, and pays what the engine reports, streamed or not, large or small. The gateway's
clock stands still, so every figure is exact."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.catalog import Catalog
from gateway.config import GatewayConfig
from gateway.proxy import HELD_ANSWER_BYTES
from gateway.request_body import MESSAGE_TOKENS, PROMPT_TOKENS
from gateway.tenants import KeyTable, TenantLimits
from tests.gateway.engines import MODEL, gateway_serving, route
from tests.gateway.fake_pods import fake_pod, sse, usage

pytestmark = pytest.mark.timeout(60)
KEY = "sk-team-a-0123456789"
HI = [{"role": "user", "content": "hi"}]
HI_TOKENS = PROMPT_TOKENS + MESSAGE_TOKENS + len("user") + len("hi")
DELTA = orjson.dumps({"choices": [{"index": 0, "delta": {"content": "x"}}]})
USAGE_CHUNK = orjson.dumps({"choices": [], "usage": usage(10, 90)})


async def through_gateway(handler, body, tokens_per_minute, context=None, path="chat/completions"):
    """One request of tenant team-a through a gateway to a pod answering with `handler`:
    the status, the body the client read, what the pod received, and what the tenant's
    bucket holds afterwards."""
    cfg = replace(GatewayConfig(), api_keys_secret="infergrid/keys")
    tenant = TenantLimits("team-a", tokens_per_minute=tokens_per_minute)
    async with fake_pod(handler) as (pod, received):
        catalog = Catalog.of(replace(route([pod]), context_tokens=context))
        async with gateway_serving(catalog, cfg) as (gateway, url), aiohttp.ClientSession() as http:
            gateway.keys = KeyTable.of({KEY: tenant})
            gateway.clock = lambda: 0.0
            headers = {"Authorization": f"Bearer {KEY}"}
            async with http.post(f"{url}/v1/{path}", json=body, headers=headers) as resp:
                try:
                    read = await resp.read()
                except aiohttp.ClientPayloadError as err:
                    read = err
                answer = resp.status, read
            bucket = gateway.admission.state(tenant).tokens
            bucket.refill(gateway.clock())
            return *answer, received, bucket.level


async def stream_with_usage(request: web.Request, _body: dict) -> web.StreamResponse:
    return await sse(request, [DELTA, USAGE_CHUNK, b"[DONE]"])


def events(read: bytes) -> list[bytes]:
    return [e.removeprefix(b"data: ") for e in read.split(b"\n\n") if e]


def test_a_stream_pays_the_usage_the_engine_reports_and_a_client_that_did_not_ask_never_sees_it():
    body = {"model": MODEL, "messages": HI, "max_tokens": 200, "stream": True}
    status, read, received, level = asyncio.run(through_gateway(stream_with_usage, body, 1000))
    assert status == 200
    assert received[0]["stream_options"] == {"include_usage": True}  # asked of the engine
    assert events(read) == [DELTA, b"[DONE]"]  # and kept from the client
    assert level == 1000 - 100


def test_a_client_that_asked_for_the_usage_chunk_gets_it_and_its_body_unchanged():
    body = {"model": MODEL, "messages": HI, "max_tokens": 200, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    status, read, received, level = asyncio.run(through_gateway(stream_with_usage, body, 1000))
    assert (status, received, level) == (200, [body], 1000 - 100)
    assert events(read) == [DELTA, USAGE_CHUNK, b"[DONE]"]


def test_a_stream_cut_short_before_its_usage_pays_the_whole_reservation():
    async def dies(request: web.Request, _body: dict) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: " + DELTA + b"\n\n")
        request.transport.abort()
        return response

    body = {"model": MODEL, "messages": HI, "max_tokens": 200, "stream": True}
    status, read, _, level = asyncio.run(through_gateway(dies, body, 1000))
    assert status == 200
    assert json.loads(events(read)[-1])["error"]["code"] == "upstream_failed"
    assert level == 1000 - (HI_TOKENS + 200)


def test_a_whole_answer_pays_its_usage_small_or_relayed_large():
    for content in ("x", "x" * (3 * HELD_ANSWER_BYTES)):
        answer = orjson.dumps({"choices": [{"message": {"content": content}}],
                               "usage": usage(5, 700)})  # fmt: skip

        async def whole(_request: web.Request, _body: dict, answer=answer) -> web.Response:
            return web.Response(body=answer, content_type="application/json")

        body = {"model": MODEL, "messages": HI, "max_tokens": 800}
        status, read, _, level = asyncio.run(through_gateway(whole, body, 1000))
        assert (status, read == answer, level) == (200, True, 1000 - 705)


def test_a_large_answer_cut_halfway_breaks_the_clients_connection_and_pays_the_reservation():
    async def dies(request: web.Request, _body: dict) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"choices": [{"message": {"content": "' + b"x" * (2 << 20))
        request.transport.abort()
        return response

    body = {"model": MODEL, "messages": HI, "max_tokens": 200}
    status, read, _, level = asyncio.run(through_gateway(dies, body, 1000))
    assert status == 200
    assert isinstance(read, aiohttp.ClientPayloadError)  # never a whole, truncated body
    assert level == 1000 - (HI_TOKENS + 200)


async def never_called(_request: web.Request, _body: dict) -> web.Response:
    raise AssertionError("the request reached the engine")


@pytest.mark.parametrize(
    ("body", "path", "context", "reserved"),
    [
        # token ids count one each, not by the length of their digits
        ({"model": MODEL, "prompt": [17] * 1000, "max_tokens": 1}, "completions", None,
         PROMPT_TOKENS + 1000 + 1),
        # a chat without max_tokens may fill the service's whole context
        ({"model": MODEL, "messages": HI}, "chat/completions", 2048, 2048),
        # n answers, each up to max_tokens
        ({"model": MODEL, "messages": HI, "max_tokens": 300, "n": 4}, "chat/completions",
         None, HI_TOKENS + 4 * 300),
    ],
)  # fmt: skip
def test_a_reservation_over_the_whole_bucket_is_refused_at_once_saying_so(
    body, path, context, reserved
):
    status, read, received, level = asyncio.run(
        through_gateway(never_called, body, 1000, context, path)
    )
    error = json.loads(read)["error"]
    assert (status, error["param"], error["code"]) == (400, "max_tokens", "tokens_over_capacity")
    assert f"may cost {reserved} model tokens" in error["message"]
    assert "never be admitted" in error["message"]
    assert (received, level) == ([], 1000)


def test_once_the_reported_usage_drains_the_bucket_the_next_request_waits_for_it():
    spent = orjson.dumps({"choices": [], "usage": usage(10, 540)})

    async def long_stream(request: web.Request, _body: dict) -> web.StreamResponse:
        return await sse(request, [DELTA, spent, b"[DONE]"])

    async def run():
        cfg = replace(GatewayConfig(), api_keys_secret="infergrid/keys")
        tenant = TenantLimits("team-a", tokens_per_minute=600)  # 10 a second
        async with fake_pod(long_stream) as (pod, received):
            async with gateway_serving(Catalog.of(route([pod])), cfg) as (gateway, url):
                gateway.keys = KeyTable.of({KEY: tenant})
                gateway.clock = lambda: 0.0
                headers = {"Authorization": f"Bearer {KEY}"}
                answers = []
                async with aiohttp.ClientSession() as http:
                    for asked in (500, 16):  # reserving 578 of 600, then 94
                        body = {"model": MODEL, "messages": HI, "max_tokens": asked,
                                "stream": True}  # fmt: skip
                        async with http.post(f"{url}/v1/chat/completions", json=body,
                                             headers=headers) as resp:  # fmt: skip
                            answers.append((resp.status, resp.headers.get("Retry-After"),
                                            await resp.read()))  # fmt: skip
                return answers, len(received)

    (first, second), reached = asyncio.run(run())
    assert first[0] == 200
    status, retry_after, read = second
    assert (status, json.loads(read)["error"]["code"]) == (429, "tokens_limit")
    # 50 tokens left of 600, and 16 + HI_TOKENS wanted: the rest comes at 10 a second
    assert int(retry_after) == -(-(HI_TOKENS + 16 - 50) // 10)
    assert reached == 1
