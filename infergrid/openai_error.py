"""The OpenAI API's error object, as the engine and the gateway both answer it, so a client
sees one shape whichever of them refused its request."""

from __future__ import annotations

from typing import Any


def error_body(
    message: str, kind: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
