"""Engine pods played by aiohttp handlers, for what a real engine would not do on cue: report
a chosen usage, send a 200 MiB answer, fail halfway."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web

from gateway.catalog import Backend
from harness.engine_process import free_port
from infergrid.tracks import STABLE

Handler = Callable[[web.Request, dict], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def fake_pod(handler: Handler, n: int = 0) -> AsyncIterator[tuple[Backend, list[dict]]]:
    """A pod whose POSTs `handler` answers, given the request and its JSON body; yields the
    pod as a backend and the bodies it received. Its /metrics is empty."""
    received: list[dict] = []

    async def post(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        received.append(body)
        return await handler(request, body)

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application(client_max_size=64 << 20)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/{tail:.*}", post)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    pod = f"tiny-5d4f7c9b8-{'bcdfg'[n:] + 'bcdfg'[:n]}"
    try:
        yield Backend("ml", pod, f"http://127.0.0.1:{port}", STABLE), received
    finally:
        await runner.cleanup()


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}  # fmt: skip


async def sse(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    """A stream of these `data:` events, one write each."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in events:
        await response.write(b"data: " + event + b"\n\n")
    await response.write_eof()
    return response
