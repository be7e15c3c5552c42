"""A body read whole, but never past a limit: what every part reads from a peer it does not
control (an engine's /metrics, an engine's answer, a client's request)."""

from __future__ import annotations

import aiohttp


async def read_capped(stream: aiohttp.StreamReader, limit: int) -> bytes | None:
    """The whole body, or None as soon as it passes `limit` bytes (decompressed, if it was
    compressed), so that a large or endless body is never held in memory.

    `stream.read(n)` is no substitute: it returns what one chunk brought, at most n bytes,
    not the body up to n."""
    body = bytearray()
    async for chunk in stream.iter_any():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)
