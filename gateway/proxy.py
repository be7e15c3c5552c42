"""One request forwarded to one engine pod, its answer passed back as it comes.

Until the first byte reaches the client, a failed pod is the gateway's problem, not the
client's: `forward` raises `Retryable` (connection refused or reset, the pod answered 503
because it is draining or not ready, a whole answer cut short), and the caller tries another
pod. Once a stream has started, a pod that dies ends the client's stream with an OpenAI
error event, never a hang and never a silent, truncated success.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import aiohttp
import orjson
from aiohttp import web

from gateway.catalog import Backend
from infergrid.capped_read import read_capped
from infergrid.openai_error import error_body

log = logging.getLogger("infergrid.gateway.proxy")

FORWARDED_HEADERS: Final = ("content-type", "accept", "x-request-id", "traceparent")
ANSWER_HEADERS: Final = ("content-type", "cache-control", "retry-after", "x-request-id")
MAX_ANSWER_BYTES: Final = 256 << 20  # a whole (non-streamed) answer held at most
USAGE_PARSE_BYTES: Final = 4 << 20  # larger answers are not parsed for their token count
UPSTREAM_FAILURES: Final = (aiohttp.ClientError, OSError, TimeoutError, asyncio.IncompleteReadError)


class UpstreamTimeout(Exception):
    """The pod took the request but gave no answer in time. It may still be working on it,
    so the request is not tried on another pod: that would double the work a slow engine
    already cannot keep up with, and the client's wait."""


class Retryable(Exception):
    """The pod failed before the client saw a byte; another pod may answer."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Answer:
    response: web.StreamResponse
    status: int
    tokens_used: int | None  # from the answer's usage, where it reported one
    cut_short: bool = False  # a stream ended by the pod's failure


async def forward(
    session: aiohttp.ClientSession,
    backend: Backend,
    request: web.Request,
    body: bytes,
    timeouts: aiohttp.ClientTimeout,
    on_first_byte: Callable[[], None],
) -> Answer:
    headers = {k: v for k in FORWARDED_HEADERS if (v := request.headers.get(k))}
    try:
        upstream = await session.post(
            f"{backend.url}{request.path}", data=body, headers=headers, timeout=timeouts,
            allow_redirects=False,
        )  # fmt: skip
    except aiohttp.ConnectionTimeoutError as err:  # never connected: nothing was sent
        raise Retryable("connect", _describe(err)) from None
    except TimeoutError as err:  # sent, and no answer came within the upstream timeout
        raise UpstreamTimeout(_describe(err)) from None
    except UPSTREAM_FAILURES as err:
        raise Retryable("connect", _describe(err)) from None
    async with upstream:
        if upstream.status == 503:  # draining or not ready yet: another pod may be ready
            raise Retryable("unavailable", "the pod answered 503")
        if 300 <= upstream.status < 400:
            # An engine never redirects: a pod that does points the gateway elsewhere (the
            # cloud's metadata address, another tenant's engine), so it is an upstream fault.
            raise Retryable("redirect", f"the pod answered {upstream.status}, not followed")
        answer_headers = {k: v for k in ANSWER_HEADERS if (v := upstream.headers.get(k))}
        if upstream.content_type == "text/event-stream":
            return await _stream(upstream, request, answer_headers, backend, on_first_byte)
        return await _whole(upstream, answer_headers, on_first_byte)


async def _whole(
    upstream: aiohttp.ClientResponse, headers: dict[str, str], on_first_byte: Callable[[], None]
) -> Answer:
    try:
        body = await read_capped(upstream.content, MAX_ANSWER_BYTES)
    except UPSTREAM_FAILURES as err:
        raise Retryable("mid_answer", _describe(err)) from None
    if body is None:
        raise Retryable("mid_answer", f"answer over {MAX_ANSWER_BYTES} bytes")
    on_first_byte()
    used = _usage(body) if upstream.status == 200 else None
    response = web.Response(status=upstream.status, body=body, headers=headers)
    return Answer(response, upstream.status, used)


def _usage(body: bytes) -> int | None:
    if len(body) > USAGE_PARSE_BYTES:
        return None
    try:
        doc = orjson.loads(body)  # a few ms at most, at the cap
    except orjson.JSONDecodeError:
        return None
    usage = doc.get("usage") if isinstance(doc, dict) else None
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    return total if isinstance(total, int) and not isinstance(total, bool) else None


async def _stream(
    upstream: aiohttp.ClientResponse,
    request: web.Request,
    headers: dict[str, str],
    backend: Backend,
    on_first_byte: Callable[[], None],
) -> Answer:
    chunks = upstream.content.iter_any()
    try:
        first = await anext(chunks, b"")
    except UPSTREAM_FAILURES as err:
        raise Retryable("mid_answer", _describe(err)) from None
    response = web.StreamResponse(status=upstream.status, headers=headers)
    await response.prepare(request)
    on_first_byte()
    try:
        await response.write(first)
        while True:
            try:
                chunk = await anext(chunks, None)
            except UPSTREAM_FAILURES as err:
                await _end_with_error(response, backend, _describe(err))
                return Answer(response, upstream.status, None, cut_short=True)
            if chunk is None:
                break
            await response.write(chunk)
        await response.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        log.debug("the client of a stream from %s went away", backend.pod)
    return Answer(response, upstream.status, None)


async def _end_with_error(response: web.StreamResponse, backend: Backend, detail: str) -> None:
    """What a client sees when the pod dies mid-stream: an error event, then the end."""
    log.warning("engine pod %s/%s failed mid-stream: %s", backend.namespace, backend.pod, detail)
    event = error_body(
        "the engine serving this stream failed before it ended; retry the request",
        "server_error",
        code="upstream_failed",
    )
    await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
    await response.write_eof()


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
