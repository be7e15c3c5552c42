"""A gateway replica told to stop (SIGTERM) drains: it keeps serving while the Service still
sends it requests, each answer closing its connection so clients move to a replica still
ready, and what is still in flight when the drain ends gets an answer its client can act
on, never a silent cut."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web

from gateway.catalog import Catalog
from gateway.main import drain
from tests.gateway.engines import MODEL, gateway_serving, route
from tests.gateway.fake_pods import fake_pod

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
FIRST = b'{"choices": [{"index": 0, "delta": {"content": "a"}}]}'


def endless_stream(released: asyncio.Event):
    """An engine pod that sends one chunk and then nothing until the test ends."""

    async def handle(request: web.Request, _body: dict) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: " + FIRST + b"\n\n")
        await released.wait()
        return response

    return handle


def never_answers(released: asyncio.Event):
    """An engine pod that answers nothing until the test ends."""

    async def handle(_request: web.Request, _body: dict) -> web.StreamResponse:
        await released.wait()
        return web.json_response({})

    return handle


async def answers(_request: web.Request, _body: dict) -> web.StreamResponse:
    return web.json_response({"choices": [], "usage": {"total_tokens": 1}})


@asynccontextmanager
async def serving(handler, released: asyncio.Event | None = None):
    """The gateway in front of one fake pod answering with `handler`; the pod's handlers
    still waiting are released at the end."""
    async with fake_pod(handler) as (backend, _):
        try:
            async with gateway_serving(Catalog.of(route([backend]))) as served:
                yield served
        finally:
            if released is not None:
                released.set()


def test_a_stream_still_running_when_the_drain_ends_gets_an_error_event_then_its_end():
    async def run():
        released = asyncio.Event()
        async with (
            serving(endless_stream(released), released) as (gateway, url),
            aiohttp.ClientSession() as http,
        ):
            events = []
            async with http.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": True}) as r:
                async for line in r.content:
                    if line.startswith(b"data: "):
                        events.append(line[6:].strip())
                    if len(events) == 1 and not gateway.draining:
                        draining = asyncio.ensure_future(drain(gateway, 0.5))
            await draining
            return events, gateway.in_flight

    events, in_flight = asyncio.run(run())
    assert events[0] == FIRST
    error = json.loads(events[1])["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "gateway_shut_down")
    assert "retry" in error["message"]
    assert len(events) == 2 and in_flight == 0


def test_a_request_whose_answer_has_not_begun_when_the_drain_ends_gets_a_503_to_retry():
    async def run():
        released = asyncio.Event()
        async with (
            serving(never_answers(released), released) as (gateway, url),
            aiohttp.ClientSession() as http,
        ):
            call = asyncio.ensure_future(http.post(f"{url}/v1/chat/completions", json=CHAT))
            while gateway.in_flight == 0:
                await asyncio.sleep(0.01)
            await drain(gateway, 0.5)
            async with await call as resp:
                return resp.status, resp.headers.get("Retry-After"), await resp.json()

    status, retry_after, doc = asyncio.run(run())
    assert (status, retry_after) == (503, "1")
    assert doc["error"]["code"] == "gateway_shut_down"


def test_while_draining_requests_are_still_served_and_each_answer_closes_its_connection():
    async def run():
        async with serving(answers) as (gateway, url), aiohttp.ClientSession() as http:
            seen = []
            for draining in (False, True):
                gateway.draining = draining
                async with http.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                    seen.append((resp.status, resp.headers.get("Connection", "keep-alive")))
            return seen

    assert asyncio.run(run()) == [(200, "keep-alive"), (200, "close")]
