"""A request's body, read within a deadline.

aiohttp waits for a body as long as its client keeps the connection open, so a client that
sends a byte now and then (slowloris) would hold a connection, and a handler, forever; a
few hundred such clients exhaust the server. The deadline bounds what a slow client costs.
The headers have the same deadline: `start_site` makes it aiohttp's keep-alive timeout,
which closes a connection that has not sent a whole request in that time.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from batching_engine.server.errors import BodyTimeoutError


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The whole body, or BodyTimeoutError (a 408 that closes the connection)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        raise BodyTimeoutError("body", f"did not arrive within {timeout_s:g} seconds") from None
