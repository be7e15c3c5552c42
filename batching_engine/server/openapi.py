"""The engine's OpenAPI document: its OpenAI-style routes, the probes, /metrics.

The request schemas are built from the constants `protocol` checks (ranges, enumerations,
the neutral values of the OpenAI fields the engine does not implement), so a changed limit
changes the document with the reader; tests/batching_engine/test_openapi.py checks both
ways. What only the served model decides (its name, vocabulary, context length, priority
classes) is not in the document: a body the schema allows may still get a 400 or 404 naming
that field. Null is allowed wherever the parser reads it as absent, since OpenAI's clients
send explicit nulls. Unknown fields are ignored, as OpenAI does, hence no
`additionalProperties: false`.
"""

from __future__ import annotations

from typing import Any, Final

from batching_engine.server.protocol import (
    CHAT_ROLES,
    ENCODING_FORMATS,
    MAX_EMBEDDING_INPUTS,
    MAX_STOP_LENGTH,
    MAX_STOP_SEQUENCES,
    MAX_TOKENS_LIMIT,
    PRIORITY_RANGE,
    SEED_RANGE,
    UNSUPPORTED,
)
from infergrid import __version__
from infergrid.openai_error import ERROR_SCHEMA
from infergrid.openapi import OPENAPI_PATH, Operation, Response, Schema, document

_NULL: Final[Schema] = {"type": "null"}
_NAME: Final[Schema] = {"type": "string", "minLength": 1}
_TOKEN_IDS: Final[Schema] = {
    "type": "array",
    "minItems": 1,
    "items": {"type": "integer", "minimum": 0},
    "description": "token ids, each inside the served model's vocabulary",
}
_STOP_STRING: Final[Schema] = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_LENGTH}


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, _NULL]}


def _integer(low: int, high: int) -> Schema:
    return _nullable({"type": "integer", "minimum": low, "maximum": high})


_PRIORITY: Final[Schema] = {
    **_integer(*PRIORITY_RANGE),
    "description": "a priority class, 0 first; the engine's priority levels bound it",
}


def _unsupported() -> dict[str, Schema]:
    """Each OpenAI field the engine does not implement: only its neutral values pass."""
    return {
        key: {"enum": [*neutral, None], "description": "not implemented: only this value"}
        for key, neutral in UNSUPPORTED.items()
    }


def _sampling() -> dict[str, Schema]:
    return {
        "max_tokens": _integer(1, MAX_TOKENS_LIMIT),
        "temperature": _nullable({"type": "number", "minimum": 0.0, "maximum": 2.0}),
        "top_p": _nullable({"type": "number", "exclusiveMinimum": 0.0, "maximum": 1.0}),
        "top_k": {**_integer(-1, MAX_TOKENS_LIMIT), "description": "0 or -1: off"},
        "stop": {
            "anyOf": [
                _STOP_STRING,
                {"type": "array", "maxItems": MAX_STOP_SEQUENCES, "items": _STOP_STRING},
                _NULL,
            ]
        },
        "seed": _integer(*SEED_RANGE),
        "ignore_eos": _nullable({"type": "boolean"}),
        "n": _integer(1, 1),
        "priority": _PRIORITY,
        **_unsupported(),
    }


_STREAM_OPTIONS: Final[Schema] = {
    "type": "object",
    "properties": {"include_usage": _nullable({"type": "boolean"})},
}


def _generation_body(properties: dict[str, Schema], required: list[str]) -> Schema:
    """A body that may stream: `stream_options` only with `stream: true`.

    The top-level `properties` list every field; the two `anyOf` branches carry the one
    rule between fields, each with every field, so a body drawn from either is whole.
    """
    options = _nullable(_STREAM_OPTIONS)
    every = properties | {"stream": _nullable({"type": "boolean"}), "stream_options": options}
    streamed = properties | {"stream": {"const": True}, "stream_options": options}
    unstreamed = properties | {"stream": {"enum": [False, None]}, "stream_options": _NULL}
    return {
        "type": "object",
        "required": required,
        "properties": every,
        "anyOf": [
            {"type": "object", "required": [*required, "stream"], "properties": streamed},
            {"type": "object", "required": required, "properties": unstreamed},
        ],
    }


COMPLETION_BODY: Final = _generation_body(
    {
        "model": _nullable(_NAME),
        "prompt": {
            "anyOf": [
                _NAME,
                _TOKEN_IDS,
                {"type": "array", "minItems": 1, "maxItems": 1, "items": _NAME},
                {"type": "array", "minItems": 1, "maxItems": 1, "items": _TOKEN_IDS},
            ],
            "description": "one prompt: text or token ids (a list of one is unwrapped)",
        },
        **_sampling(),
    },
    ["prompt"],
)

_TEXT_PART: Final[Schema] = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}
_MESSAGE: Final[Schema] = {
    "anyOf": [
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"enum": list(CHAT_ROLES)},
                "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]},
            },
        },
        {
            "type": "object",
            "required": ["role"],
            "properties": {"role": {"const": "assistant"}, "content": _NULL},
        },
    ]
}
CHAT_BODY: Final = _generation_body(
    {
        "model": _nullable(_NAME),
        "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
        **_sampling(),
        "max_completion_tokens": {
            **_integer(1, MAX_TOKENS_LIMIT),
            "description": "max_tokens's newer name; without either, up to the context's end",
        },
    },
    ["messages"],
)

_INPUT_ITEM: Final[Schema] = {"anyOf": [_NAME, _TOKEN_IDS]}
EMBEDDING_BODY: Final[Schema] = {
    "type": "object",
    "required": ["input"],
    "properties": {
        "model": _nullable(_NAME),
        "input": {
            "anyOf": [
                _NAME,
                _TOKEN_IDS,
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_EMBEDDING_INPUTS,
                    "items": _INPUT_ITEM,
                },
            ]
        },
        "encoding_format": _nullable({"enum": list(ENCODING_FORMATS)}),
        "dimensions": {**_NULL, "description": "not supported: the models cannot shorten vectors"},
        "priority": _PRIORITY,
    },
}

# Answers, described loosely: the fields OpenAI's clients read.
_USAGE: Final[Schema] = {
    "type": "object",
    "properties": {
        key: {"type": "integer", "minimum": 0}
        for key in ("prompt_tokens", "completion_tokens", "total_tokens")
    },
}
_COMPLETION: Final[Schema] = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "id": {"type": "string"},
        "object": {"enum": ["text_completion", "chat.completion"]},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "index": {"type": "integer"},
                    "text": {"type": "string"},
                    "message": {"type": "object"},
                    "finish_reason": {"enum": ["stop", "length", None]},
                },
            },
        },
        "usage": _USAGE,
    },
}
_EMBEDDINGS: Final[Schema] = {
    "type": "object",
    "required": ["object", "data", "model"],
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "index": {"type": "integer"},
                    "embedding": {
                        "anyOf": [
                            {"type": "array", "items": {"type": "number"}},
                            {"type": "string", "description": "base64 of little-endian float32"},
                        ]
                    },
                },
            },
        },
        "model": {"type": "string"},
        "usage": _USAGE,
    },
}
_MODELS: Final[Schema] = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array", "maxItems": 1}},
}
_STATUS: Final[Schema] = {"type": "object", "properties": {"status": {"type": "string"}}}


def _errors(*codes: int) -> dict[int, Response]:
    reasons = {
        400: "a field is wrong: `param` names it",
        401: "an engine token is set and the request lacks it (X-InferGrid-Engine-Token)",
        404: "`model` names a model this engine does not serve",
        408: "the body did not arrive within the read timeout",
        413: "the body is larger than the engine's limit",
        429: "the queue is full, or the request waited in it too long; see Retry-After",
        500: "the model step failed: the engine's fault, never the request's",
        503: "the model is loading or the engine is draining; see Retry-After",
    }
    return {code: Response(reasons[code], ERROR_SCHEMA) for code in codes}


_POST_ERRORS: Final = (400, 401, 404, 408, 413, 429, 500, 503)


def _post(path: str, summary: str, body: Schema, answer: Response) -> Operation:
    return Operation(
        "post", path, summary, {200: answer, **_errors(*_POST_ERRORS)}, body, ("openai",)
    )


OPERATIONS: Final = [
    _post(
        "/v1/completions",
        "Complete a prompt",
        COMPLETION_BODY,
        Response("the completion; with stream: true, server-sent events", _COMPLETION),
    ),
    _post(
        "/v1/chat/completions",
        "Answer a conversation",
        CHAT_BODY,
        Response("the answer; with stream: true, server-sent events", _COMPLETION),
    ),
    _post(
        "/v1/embeddings",
        "Embed texts or token lists",
        EMBEDDING_BODY,
        Response("one vector per input, in order", _EMBEDDINGS),
    ),
    Operation(
        "get",
        "/v1/models",
        "The one model served",
        {200: Response("the model", _MODELS), **_errors(401, 503)},
        tags=("openai",),
    ),
    Operation(
        "get",
        "/healthz",
        "Liveness: fails only when the worker thread died",
        {200: Response("alive", _STATUS), 503: Response("the worker stopped", _STATUS)},
    ),
    Operation(
        "get",
        "/readyz",
        "Readiness: loaded, warmed up and not draining",
        {200: Response("ready", _STATUS), 503: Response("loading, warming or draining", _STATUS)},
    ),
    Operation(
        "get",
        "/metrics",
        "Prometheus metrics",
        {200: Response("the exposition", content_type="text/plain")},
    ),
    Operation(
        "get", OPENAPI_PATH, "This document", {200: Response("OpenAPI 3.1", {"type": "object"})}
    ),
]

DOCUMENT: Final[dict[str, Any]] = document(
    "InferGrid batching engine",
    __version__,
    "The OpenAI-style API of one inference pod (infergrid-engine).",
    OPERATIONS,
)
