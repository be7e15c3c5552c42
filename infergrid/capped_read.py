"""A body read whole, but never past a limit: what every part reads from a peer it does not
control (an engine's /metrics, an engine's answer, a client's request)."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp


async def read_capped(
    stream: aiohttp.StreamReader, limit: int, take: Callable[[int], bool] | None = None
) -> bytes | None:
    """The whole body, or None as soon as it passes `limit` bytes (decompressed, if it was
    compressed), so that a large or endless body is never held in memory; None too as soon
    as `take`, asked for each chunk's size before it is kept, says no (a budget shared with
    other readers, which the caller asks why).

    `stream.read(n)` is no substitute: it returns what one chunk brought, at most n bytes,
    not the body up to n."""
    body = bytearray()
    async for chunk in stream.iter_any():
        if len(body) + len(chunk) > limit or (take is not None and not take(len(chunk))):
            return None
        body += chunk
    return bytes(body)
