"""A tenant's pod that answers with a redirect, to have the gateway fetch another address
for it (a cloud's metadata service, an in-cluster service, another tenant's engine): the
gateway follows no redirect, for a request or a scrape, and a 3xx is the pod's failure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from gateway.catalog import Backend, Catalog
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
            catalog = Catalog({MODEL: route([pod])})
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
