"""What a pod's answer may make the gateway do, and what not. A tenant's pod that answers
with a redirect, to have the gateway fetch another address for it (a cloud's metadata
service, an in-cluster service, another tenant's engine): the gateway follows no redirect,
for a request or a scrape, and a 3xx is the pod's failure. A pod that takes a request and
never answers: the request is not sent to another pod."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from gateway.catalog import Backend, Catalog
from gateway.config import GatewayConfig
from gateway.loads import Loads, scrape
from harness.engine_process import free_port
from infergrid.tracks import STABLE
from tests.gateway.engines import MODEL, gateway_serving, route

pytestmark = pytest.mark.timeout(60)
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@asynccontextmanager
async def redirecting_pod(status: int) -> AsyncIterator[tuple[Backend, list[str]]]:
    """A pod whose every answer is `status` to /secret on the same server, which records
    each hit and would answer as an engine does."""
    port, hits = free_port(), []

    async def redirect(request: web.Request) -> web.Response:
        return web.Response(status=status, headers={"Location": f"http://127.0.0.1:{port}/secret"})

    async def secret(request: web.Request) -> web.Response:
        hits.append(request.method)
        return web.json_response({"choices": [], "stolen": True})

    app = web.Application()
    app.router.add_route("*", "/secret", secret)
    app.router.add_route("*", "/{tail:.*}", redirect)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield Backend("team-a", "tiny-5d4f7c9b8-bcdfg", f"http://127.0.0.1:{port}", STABLE), hits
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_from_a_pod_is_an_upstream_failure_never_followed(status):
    async def run() -> tuple[int, dict, list[str]]:
        async with redirecting_pod(status) as (pod, hits):
            catalog = Catalog.of(route([pod]))
            async with gateway_serving(catalog) as (_, url), aiohttp.ClientSession() as http:
                async with http.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                    return resp.status, await resp.json(), hits

    status_seen, body, hits = asyncio.run(run())
    assert hits == []
    assert status_seen == 503, body
    assert body["error"]["type"] == "service_unavailable"
    assert "stolen" not in body


def test_a_load_scrape_does_not_follow_a_redirect():
    async def run() -> tuple[float, list[str]]:
        async with redirecting_pod(307) as (pod, hits), aiohttp.ClientSession() as http:
            loads = Loads(cooldown_s=1)
            await scrape(http, loads, [pod], timeout_s=2)
            return loads.work(pod.key), hits

    work, hits = asyncio.run(run())
    assert hits == [] and work == 0


@asynccontextmanager
async def slow_pods(count: int, delay_s: float) -> AsyncIterator[tuple[list[Backend], list[int]]]:
    """`count` pods that take every request and answer only after `delay_s`; `hits` counts
    the requests each one took (not the gateway's scrapes)."""
    hits = [0] * count
    runners = []
    pods = []
    for i in range(count):

        async def answer(request: web.Request, i: int = i) -> web.Response:
            if request.method != "POST":  # the gateway's load scrapes of /metrics
                return web.Response(status=404)
            hits[i] += 1
            await asyncio.sleep(delay_s)
            return web.json_response({"choices": []})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        pods.append(
            Backend("ml", f"tiny-5d4f7c9b8-bcdf{'gh'[i]}", f"http://127.0.0.1:{port}", STABLE)
        )
    try:
        yield pods, hits
    finally:
        for runner in runners:
            await runner.cleanup()


def test_a_request_a_pod_took_and_never_answered_is_not_sent_to_another_pod():
    """The slow pod may still be working on it: a second copy would double the work, and
    the client's wait. The client gets a 504 after the upstream timeout, once."""

    async def run() -> tuple[int, dict, list[int]]:
        async with slow_pods(2, delay_s=3) as (pods, hits):
            cfg = GatewayConfig(upstream_timeout_s=0.5)
            async with (
                gateway_serving(Catalog.of(route(pods)), cfg) as (_, url),
                aiohttp.ClientSession() as http,
                http.post(f"{url}/v1/chat/completions", json=CHAT) as resp,
            ):
                return resp.status, await resp.json(), list(hits)

    status, body, hits = asyncio.run(run())
    assert status == 504, body
    assert "within 0.5 s" in body["error"]["message"]
    assert sorted(hits) == [0, 1]
