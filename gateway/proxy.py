"""One request forwarded to one engine pod, its answer passed back as it comes.

Until the first byte reaches the client, a failed pod is the gateway's problem, not the
client's: `forward` raises `Retryable` (connection refused or reset, the pod answered 503
because it is draining or not ready, a whole answer cut short), and the caller tries another
pod. Once a stream has started, a pod that dies ends the client's stream with an OpenAI
error event, never a hang and never a silent, truncated success.

A whole answer up to `HELD_ANSWER_BYTES` is held, so a pod that fails while sending it is
retried; a larger one is relayed as it comes, holding no more than a read's chunk and the
tail its usage is read from (`reported_usage`), and a pod that fails while relaying it
breaks the client's connection, so the client sees a cut answer as cut. Either way the
answer's reported usage settles the tenant's bucket.
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
from gateway.reported_usage import StreamUsage, Tail, usage_in_tail
from infergrid.engine_token import HEADER as ENGINE_TOKEN_HEADER
from infergrid.openai_error import error_body

log = logging.getLogger("infergrid.gateway.proxy")

FORWARDED_HEADERS: Final = ("content-type", "accept", "x-request-id", "traceparent")
ANSWER_HEADERS: Final = ("content-type", "cache-control", "retry-after", "x-request-id")
MAX_ANSWER_BYTES: Final = 256 << 20  # a whole (non-streamed) answer relayed at most
HELD_ANSWER_BYTES: Final = 1 << 20  # a whole answer held (and retried) at most
UPSTREAM_FAILURES: Final = (aiohttp.ClientError, OSError, TimeoutError, asyncio.IncompleteReadError)
SHUT_DOWN: Final = "the gateway replica is shutting down"  # a drain's cancel message


def shut_down(err: asyncio.CancelledError) -> bool:
    """Whether the cancel is a drain's cut-off (Gateway.cut_off), which is answered, not a
    client that went away, which is not."""
    return err.args[:1] == (SHUT_DOWN,)


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
    tokens_used: int | None  # what the answer reported (0 for an error); None: no report
    cut_short: bool = False  # an answer ended by the pod's failure


async def forward(
    session: aiohttp.ClientSession,
    backend: Backend,
    request: web.Request,
    body: bytes,
    timeouts: aiohttp.ClientTimeout,
    on_first_byte: Callable[[], None],
    engine_token: str = "",
    hide_usage: bool = False,
) -> Answer:
    """The client's own Authorization never reaches the pod (FORWARDED_HEADERS); the
    service's engine token does, where the gateway has a key (infergrid/engine_token.py).
    `hide_usage`: a stream's usage chunk is read, and kept from the client, which did not
    ask for it."""
    headers = {k: v for k in FORWARDED_HEADERS if (v := request.headers.get(k))}
    if engine_token:
        headers[ENGINE_TOKEN_HEADER] = engine_token
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
            usage = StreamUsage(hide_usage)
            return await _stream(upstream, request, answer_headers, backend, on_first_byte, usage)
        return await _whole(upstream, request, answer_headers, backend, on_first_byte)


async def _whole(
    upstream: aiohttp.ClientResponse,
    request: web.Request,
    headers: dict[str, str],
    backend: Backend,
    on_first_byte: Callable[[], None],
) -> Answer:
    """The answer held whole when it is small (a failure is retried), else relayed."""
    chunks = upstream.content.iter_any()
    held = bytearray()
    try:
        while len(held) <= HELD_ANSWER_BYTES:
            chunk = await anext(chunks, None)
            if chunk is None:
                on_first_byte()
                body = bytes(held)
                response = web.Response(status=upstream.status, body=body, headers=headers)
                return Answer(response, upstream.status, _reported(upstream.status, body))
            held += chunk
    except UPSTREAM_FAILURES as err:
        raise Retryable("mid_answer", _describe(err)) from None
    return await _relay(upstream, request, headers, backend, bytes(held), on_first_byte)


async def _relay(
    upstream: aiohttp.ClientResponse,
    request: web.Request,
    headers: dict[str, str],
    backend: Backend,
    head: bytes,
    on_first_byte: Callable[[], None],
) -> Answer:
    """A large whole answer, sent on as it comes. A pod that fails, or an answer past
    MAX_ANSWER_BYTES, breaks the client's connection instead of ending the body: a
    chunked body without its last chunk is one no HTTP client takes for whole."""
    response = web.StreamResponse(status=upstream.status, headers=headers)
    await response.prepare(request)
    on_first_byte()
    tail, sent = Tail(), 0
    chunks = upstream.content.iter_any()
    try:
        chunk: bytes | None = head
        while chunk is not None:
            sent += len(chunk)
            if sent > MAX_ANSWER_BYTES:
                return _break(request, response, upstream.status, backend, "answer too large")
            tail.add(chunk)
            await response.write(chunk)
            try:
                chunk = await anext(chunks, None)
            except UPSTREAM_FAILURES as err:
                return _break(request, response, upstream.status, backend, _describe(err))
        await response.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        log.debug("the client of an answer from %s went away", backend.pod)
        return Answer(response, upstream.status, None)
    except asyncio.CancelledError as err:  # begun, so it cannot end well: cut as cut
        if not shut_down(err):
            raise
        _uncancel()
        return _break(request, response, upstream.status, backend, SHUT_DOWN)
    return Answer(response, upstream.status, _reported(upstream.status, tail.bytes()))


def _break(
    request: web.Request, response: web.StreamResponse, status: int, backend: Backend, why: str
) -> Answer:
    log.warning("engine pod %s/%s failed mid-answer: %s", backend.namespace, backend.pod, why)
    if request.transport is not None:
        request.transport.abort()
    return Answer(response, status, None, cut_short=True)


def _reported(status: int, tail: bytes) -> int | None:
    """The usage an answer reports; an error answer generated nothing."""
    return usage_in_tail(tail) if 200 <= status < 300 else 0


async def _stream(
    upstream: aiohttp.ClientResponse,
    request: web.Request,
    headers: dict[str, str],
    backend: Backend,
    on_first_byte: Callable[[], None],
    usage: StreamUsage,
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
        await response.write(usage.feed(first))
        while True:
            try:
                chunk = await anext(chunks, None)
            except UPSTREAM_FAILURES as err:
                await _end_with_error(response, backend, _describe(err))
                return Answer(response, upstream.status, usage.used, cut_short=True)
            if chunk is None:
                break
            await response.write(usage.feed(chunk))
        await response.write(usage.rest())
        await response.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        log.debug("the client of a stream from %s went away", backend.pod)
    except asyncio.CancelledError as err:
        if not shut_down(err):
            raise
        _uncancel()
        await _end_shut_down(response, backend)
    return Answer(response, upstream.status, usage.used)


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


async def _end_shut_down(response: web.StreamResponse, backend: Backend) -> None:
    """What a client sees of a stream still running when its gateway replica's drain ends:
    an error event saying to retry, then the end; never a silent cut."""
    log.warning("stream from %s/%s cut off: %s", backend.namespace, backend.pod, SHUT_DOWN)
    event = error_body(
        f"{SHUT_DOWN} and ended this stream before the engine did; retry the request",
        "service_unavailable",
        code="gateway_shut_down",
    )
    await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
    response.force_close()  # the replica is going away: so is the connection, now
    await response.write_eof()


def _uncancel() -> None:
    """The drain's cancel, answered here: the task goes on to send the answer's end."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
