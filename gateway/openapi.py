"""The gateway's OpenAPI document, served at /openapi.json and drawn from by its fuzzer.

The request bodies are built from what the gateway's body reader checks (request_body.py):
the fields OpenAI's API defines for each endpoint (`FIELDS`, any other is refused, so the
schemas allow no other property), and the ones the gateway reads itself: `model`, `stream`,
`stream_options.include_usage`, the token bounds, `n`, and the prompt it bounds the cost
of. Every other field goes to the engine untouched, which checks it and names it when it is
wrong; the gateway image holds no engine code, so those fields are described here only as
passed on. Refusals, the gateway's own and the engine's relayed unchanged, are OpenAI error
objects whose `param` names the field.
"""

from __future__ import annotations

from typing import Any, Final

from gateway.request_body import CHAT, COMPLETIONS, EMBEDDINGS, FIELDS
from infergrid.openai_error import ERROR_SCHEMA
from infergrid.openapi import OPENAPI_PATH, Operation, Response, Schema, document

HEALTHZ, READYZ, MODELS, METRICS = "/healthz", "/readyz", "/v1/models", "/metrics"

_PASSED_ON: Final[Schema] = {"description": "passed to the engine, which checks it"}
_TEXT_PART: Final[Schema] = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}
_MESSAGE: Final[Schema] = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"type": "string", "description": "the engine checks it is one it knows"},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
    },
}
_TOKEN_IDS: Final[Schema] = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_PROMPT: Final[Schema] = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "minItems": 1},
        {**_TOKEN_IDS, "minItems": 1},
        {"type": "array", "items": _TOKEN_IDS, "minItems": 1},
    ],
    "description": "bounds the reservation: at most one token per UTF-8 byte or token id",
}
_COUNT: Final[Schema] = {"type": "integer", "minimum": 1}
READ: Final[dict[str, Schema]] = {
    "model": {"type": "string", "minLength": 1, "description": "a name GET /v1/models lists"},
    "stream": {"type": "boolean", "description": "true: an SSE stream ending in [DONE]"},
    "stream_options": {
        "type": "object",
        "properties": {"include_usage": {"type": "boolean"}},
        "description": "the gateway always asks the engine for the usage chunk, to settle "
        "the tenant's bucket, and passes it on only when include_usage is true",
    },
    "max_tokens": {**_COUNT, "description": "reserved from the tenant's tokens per minute"},
    "max_completion_tokens": {**_COUNT, "description": "the newer name of max_tokens"},
    "n": {**_COUNT, "description": "answers generated, each reserved"},
    "messages": {"type": "array", "items": _MESSAGE},
    "prompt": _PROMPT,
    "input": _PROMPT,
}
"""The schema of each field the gateway reads itself; `model` and `stream` it refuses when
wrong, the others it only bounds the request's cost by, and the engine refuses."""
REQUIRED: Final[dict[str, tuple[str, ...]]] = {
    CHAT: ("model", "messages"),
    COMPLETIONS: ("model", "prompt"),
    EMBEDDINGS: ("model", "input"),
}


def body_schema(endpoint: str) -> Schema:
    """The endpoint's body: every field OpenAI defines for it, no other."""
    return {
        "type": "object",
        "required": list(REQUIRED[endpoint]),
        "properties": {name: READ.get(name, _PASSED_ON) for name in sorted(FIELDS[endpoint])},
        "additionalProperties": False,
    }


def _errors(*codes: int) -> dict[int, Response]:
    why = {
        400: "a field is wrong (param names it), from the gateway or the engine",
        401: "no API key, or one that is not valid",
        403: "the engine refused the caller",
        404: "the model is not served to this key (the message lists those that are)",
        408: "the body did not arrive within readTimeoutSeconds (param: body)",
        413: "the body is over maxBodyBytes (param: body)",
        429: "over the tenant's limits, or too many failed keys; Retry-After says when",
        503: "no ready pod answered, or none became ready in time; Retry-After",
        504: "the engine gave no answer within upstreamTimeoutSeconds",
    }
    return {code: Response(why[code], ERROR_SCHEMA) for code in codes}


def _generation(endpoint: str, summary: str) -> Operation:
    answer = Response(
        "the engine's answer: a JSON object, or with stream true an SSE stream of chunks "
        "ending in `data: [DONE]` (or in an error event when the engine fails mid-stream)",
        {"type": "object"},
    )
    return Operation(
        "post", endpoint, summary, {200: answer, **_errors(400, 401, 403, 404, 408, 413, 429,
                                                           503, 504)},
        body=body_schema(endpoint), tags=("openai",),
    )  # fmt: skip


_MODELS: Final[Schema] = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "object", "created", "owned_by"],
                "properties": {
                    "id": {"type": "string"},
                    "object": {"const": "model"},
                    "created": {"type": "integer"},
                    "owned_by": {"type": "string", "description": "namespace/service"},
                },
            },
        },
    },
}
_READY: Final[Schema] = {
    "type": "object",
    "required": ["ready", "waiting for"],
    "properties": {
        "ready": {"type": "boolean"},
        "waiting for": {"type": "array", "items": {"type": "string"}},
        "warning": {"type": "string", "description": "set while the gateway takes no keys"},
    },
}

OPERATIONS: Final = [
    _generation(CHAT, "A chat completion from the model's engine pods"),
    _generation(COMPLETIONS, "A text completion from the model's engine pods"),
    _generation(EMBEDDINGS, "Embeddings from the model's engine pods"),
    Operation(
        "get",
        MODELS,
        "The models this key may call, bare where unambiguous and qualified",
        {200: Response("the list", _MODELS), **_errors(401, 429)},
        tags=("openai",),
    ),  # fmt: skip
    Operation("get", HEALTHZ, "Liveness", {200: Response("alive", {"type": "object"})}),
    Operation(
        "get",
        READYZ,
        "Readiness: the catalog listed, the keys read, not draining",
        {200: Response("ready", _READY), 503: Response("not ready, and why", _READY)},
    ),  # fmt: skip
    Operation(
        "get",
        METRICS,
        "Prometheus metrics, on the metrics listener (metricsPort) only",
        {200: Response("the exposition", content_type="text/plain")},
    ),  # fmt: skip
    Operation("get", OPENAPI_PATH, "This document", {200: Response("it", {"type": "object"})}),
]
DOCUMENT: Final[dict[str, Any]] = document(
    "InferGrid gateway",
    "1",
    "One OpenAI endpoint for every InferenceService: keys, tenants' limits, routing.",
    OPERATIONS,
)
