"""The OpenAI API's error object, as the engine and the gateway both answer it, so a client
sees one shape whichever of them refused its request."""

from __future__ import annotations

from typing import Any, Final

_NULLABLE_TEXT: Final = {"type": ["string", "null"]}
# `error_body`'s shape, for the OpenAPI documents of every part that answers it.
ERROR_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {**_NULLABLE_TEXT, "description": "the field refused, if one was"},
                "code": _NULLABLE_TEXT,
            },
        }
    },
}


def error_body(
    message: str, kind: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
