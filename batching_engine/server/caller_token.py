"""Only callers holding the service's token reach /v1/* (infergrid/engine_token.py).

Where the cluster's network plugin does not enforce the operator's NetworkPolicy, any pod
can open the engine's port. With a token file set, a request to /v1/* without the token in
the `X-InferGrid-Engine-Token` header gets a 401 before any handler, counter or queue sees
it. The probes (/healthz, /readyz) and /metrics stay open: the kubelet, the operator's
autoscaler and the gateway's queue-depth scrape read them, and they answer no prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from batching_engine.server.errors import json_error
from infergrid.engine_token import HEADER, TOKEN_FILE_ENV, matches
from infergrid.errors import ContractError

GUARDED_PREFIX = "/v1/"


def read_token(environ: Mapping[str, str]) -> str:
    """The token in the file `TOKEN_FILE_ENV` names; "" when it names none (no check)."""
    path = environ.get(TOKEN_FILE_ENV, "")
    if not path:
        return ""
    try:
        token = Path(path).read_text(errors="replace").strip()
    except OSError as err:
        raise ContractError(TOKEN_FILE_ENV, f"cannot read {path}: {err.strerror}") from None
    if not token:
        raise ContractError(TOKEN_FILE_ENV, f"{path} is empty")
    return token


def token_check(token: str) -> Middleware:
    """A middleware refusing /v1/* without `token`; with "" it lets everything through."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token and request.path.startswith(GUARDED_PREFIX):
            if not matches(token, request.headers.get(HEADER)):
                return json_error(
                    401,
                    f"missing or wrong {HEADER} header: this engine serves only the InferGrid "
                    "gateway; call the model through the gateway",
                    "invalid_request_error",
                    HEADER,
                    "invalid_engine_token",
                )
        return await handler(request)

    return check
