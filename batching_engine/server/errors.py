"""Every failure of a request, as the OpenAI-style JSON error a client gets.

`_ERRORS` is the one table that says, for each kind of failure, its HTTP status, its
OpenAI error type, and the `requests_total` status it counts as (None where it was
counted where it was raised: the engine counts what it ended, and a 429 is counted by
whoever knows whether it was a full queue or a queue timeout).

The engine's own exception types live in `batching_engine.errors`; the ones defined here
are the server's, which only mean something over HTTP: a model this server does not
serve, not ready yet, retry later.
"""

from __future__ import annotations

import logging

from aiohttp import web

from batching_engine.errors import EngineFailedError
from batching_engine.metrics import EngineMetrics, RequestStatus
from batching_engine.server.json_fields import RequestError
from infergrid.errors import ContractError
from infergrid.openai_error import error_body

log = logging.getLogger("infergrid.engine.http")


class ModelNotFoundError(RequestError):
    """The body names a model this engine does not serve."""


class BodyTimeoutError(RequestError):
    """The client sent its body too slowly (`body.read_body`)."""


class NotReadyError(Exception):
    """The model is still loading, or the server is draining."""


class RetryLaterError(Exception):
    """Overloaded: the client should retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


# First match wins, so subclasses come first.
_ERRORS: tuple[tuple[type[BaseException], int, str, RequestStatus | None], ...] = (
    (ModelNotFoundError, 404, "invalid_request_error", RequestStatus.INVALID),
    (BodyTimeoutError, 408, "invalid_request_error", RequestStatus.INVALID),
    (ContractError, 400, "invalid_request_error", RequestStatus.INVALID),
    (RetryLaterError, 429, "rate_limit_error", None),
    (NotReadyError, 503, "service_unavailable", RequestStatus.REJECTED),
    (EngineFailedError, 500, "server_error", None),
)


def error_response(err: Exception, metrics: EngineMetrics) -> web.Response:
    """The response for an exception out of a handler; unknown ones are our bug: a 500."""
    known = _classify(err)
    if known is None:
        log.exception("request failed", exc_info=err)
        metrics.request_finished(RequestStatus.ERROR)
        return json_error(500, "internal error", "server_error", None)
    status, error_type, counted_as = known
    if counted_as is not None:
        metrics.request_finished(counted_as)
    param = err.field if isinstance(err, ContractError) else None
    code = "model_not_found" if isinstance(err, ModelNotFoundError) else None
    response = json_error(status, str(err), error_type, param, code)
    if isinstance(err, RetryLaterError):
        response.headers["Retry-After"] = str(err.retry_after)
    elif isinstance(err, NotReadyError):
        response.headers["Retry-After"] = "1"
    elif isinstance(err, BodyTimeoutError):
        response.force_close()  # the rest of a slow body is not worth waiting for
    return response


def http_error_response(
    err: web.HTTPException, metrics: EngineMetrics, max_body_bytes: int
) -> web.Response:
    """aiohttp's own refusals (body too large, no such route, wrong method) as JSON."""
    if err.status < 500:
        metrics.request_finished(RequestStatus.INVALID)
    too_large = err.status == web.HTTPRequestEntityTooLarge.status_code
    message = f"body: larger than {max_body_bytes} bytes" if too_large else err.reason
    response = json_error(
        err.status, message, "invalid_request_error", "body" if too_large else None
    )
    if "Allow" in err.headers:
        response.headers["Allow"] = err.headers["Allow"]
    return response


def json_error(
    status: int, message: str, kind: str, param: str | None, code: str | None = None
) -> web.Response:
    return web.json_response(error_body(message, kind, param, code), status=status)


def _classify(err: Exception) -> tuple[int, str, RequestStatus | None] | None:
    return next(((s, t, c) for kind, s, t, c in _ERRORS if isinstance(err, kind)), None)
