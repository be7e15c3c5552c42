"""OpenAI-style request bodies, read into plain dataclasses.

Every reader checks one field and raises a `RequestError` naming it, so the app answers
every bad body with a 400 whose `param` points at the field, and no KeyError or TypeError
ever reaches a client. As OpenAI does, unknown fields are ignored; a known field of the
wrong type is not. Limits a request can only be checked against the model (prompt length,
token ids inside the vocabulary, the model's name) are left to the app.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from batching_engine.sequence import SamplingParams
from batching_engine.server.json_fields import (
    RequestError,
    array,
    body,
    boolean,
    fraction,
    integer,
    kind,
    mapping,
    number,
    optional,
    reject_constant,
    required,
    string,
    text,
    tokens,
    value_or,
)
from batching_engine.stop import MAX_STOP_LENGTH

MAX_STOP_SEQUENCES: Final = 4
MAX_TOKENS_LIMIT: Final = 1 << 20
MAX_EMBEDDING_INPUTS: Final = 2048
CHAT_ROLES: Final = ("system", "developer", "user", "assistant", "tool")
ENCODING_FORMATS: Final = ("float", "base64")
# OpenAI fields we do not implement, with the values that ask for nothing: any other value
# gets a 400, since quietly ignoring it would give an answer the client did not ask for.
UNSUPPORTED: Final[dict[str, tuple[object, ...]]] = {
    "logprobs": (False, 0),
    "top_logprobs": (0,),
    "echo": (False,),
    "best_of": (1,),
    "suffix": ("",),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": ({},),
    "tools": ([],),
    "tool_choice": ("none", "auto"),
    "response_format": ({"type": "text"},),
}
SEED_RANGE: Final = (0, (1 << 63) - 1)
PRIORITY_RANGE: Final = (-(1 << 31), (1 << 31) - 1)


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A completion or chat request: exactly one of `prompt` and `messages` is set."""

    model: str | None
    params: SamplingParams
    prompt: str | list[int] | None = None
    messages: tuple[ChatMessage, ...] | None = None
    stream: bool = False
    include_usage: bool = False
    priority: int = 0
    fill_context: bool = False  # chat without max_tokens: generate up to the context limit


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    model: str | None
    inputs: tuple[str | list[int], ...]
    encoding_format: str = "float"
    priority: int = 0


def decode_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; NaN and Infinity are not JSON, whatever Python's json says."""
    try:
        doc = json.loads(raw, parse_constant=reject_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise RequestError("body", f"not valid JSON: {err}") from None
    if not isinstance(doc, dict):
        raise RequestError("body", f"expected a JSON object, got {kind(doc)}")
    return doc


def parse_completion(doc: object) -> GenerationRequest:
    """A /v1/completions body."""
    doc = body(doc)
    return GenerationRequest(
        model=optional(doc, "model", string),
        prompt=_prompt(doc),
        params=_sampling(doc),
        **_common(doc),
    )


def parse_chat(doc: object) -> GenerationRequest:
    """A /v1/chat/completions body; `max_completion_tokens` is the newer name of `max_tokens`.

    Without either, OpenAI's chat generates until the model stops or the context is full;
    `fill_context` tells the app to set max_tokens once it knows the prompt's length.
    """
    doc = body(doc)
    return GenerationRequest(
        model=optional(doc, "model", string),
        messages=_messages(doc),
        params=_sampling(doc, "max_completion_tokens"),
        fill_context=all(doc.get(k) is None for k in ("max_tokens", "max_completion_tokens")),
        **_common(doc),
    )


def parse_embedding(doc: object) -> EmbeddingRequest:
    """A /v1/embeddings body; `dimensions` is refused, since our models cannot shorten vectors."""
    doc = body(doc)
    if doc.get("dimensions") is not None:
        raise RequestError("dimensions", "is not supported by this model")
    fmt = optional(doc, "encoding_format", string) or "float"
    if fmt not in ENCODING_FORMATS:
        raise RequestError("encoding_format", f"must be one of {', '.join(ENCODING_FORMATS)}")
    return EmbeddingRequest(
        model=optional(doc, "model", string),
        inputs=_embedding_inputs(doc),
        encoding_format=fmt,
        priority=optional(doc, "priority", integer(*PRIORITY_RANGE)) or 0,
    )


# Field groups.


def _common(doc: dict[str, Any]) -> dict[str, Any]:
    _check_n(doc)
    _refuse_unsupported(doc)
    stream = optional(doc, "stream", boolean) or False
    options = optional(doc, "stream_options", mapping)
    if options is not None and not stream:
        raise RequestError("stream_options", "is only allowed when stream is true")
    usage = optional(options or {}, "include_usage", boolean, "stream_options.include_usage")
    return {
        "stream": stream,
        "include_usage": bool(usage),
        "priority": optional(doc, "priority", integer(*PRIORITY_RANGE)) or 0,
    }


def _sampling(doc: dict[str, Any], max_tokens_alias: str | None = None) -> SamplingParams:
    max_tokens = optional(doc, "max_tokens", integer(1, MAX_TOKENS_LIMIT))
    if max_tokens is None and max_tokens_alias:
        max_tokens = optional(doc, max_tokens_alias, integer(1, MAX_TOKENS_LIMIT))
    defaults = SamplingParams()
    return SamplingParams(
        temperature=value_or(doc, "temperature", number(0.0, 2.0), defaults.temperature),
        top_p=value_or(doc, "top_p", fraction, defaults.top_p),
        top_k=_top_k(doc),
        max_tokens=max_tokens if max_tokens is not None else defaults.max_tokens,
        stop=_stop(doc),
        seed=optional(doc, "seed", integer(*SEED_RANGE)),
        ignore_eos=optional(doc, "ignore_eos", boolean) or False,
    )


def _refuse_unsupported(doc: dict[str, Any]) -> None:
    for key, neutral in UNSUPPORTED.items():
        value = doc.get(key)
        if value is not None and not any(_same(value, n) for n in neutral):
            raise RequestError(key, f"is not supported by this engine, got {_short(value)}")


def _same(value: object, neutral: object) -> bool:
    """Equal and of the same JSON kind: `true` is not `1`, nor `0` `false`; `0.0` is `0`."""
    return _json_kind(value) == _json_kind(neutral) and value == neutral


def _json_kind(value: object) -> object:
    """bool is tried before numbers, since to isinstance a bool is an int."""
    return next((k for k in (bool, int | float, str, list, dict) if isinstance(value, k)), None)


def _short(value: object) -> str:
    dumped = json.dumps(value)
    return dumped if len(dumped) <= 40 else dumped[:37] + "..."


def _check_n(doc: dict[str, Any]) -> None:
    n = optional(doc, "n", integer(1, MAX_TOKENS_LIMIT))
    if n not in (None, 1):
        raise RequestError("n", f"only n=1 is supported, got {n}")


def _top_k(doc: dict[str, Any]) -> int:
    """0 or -1 turn top-k off (-1 is vLLM's spelling); internally 0 means off."""
    value = optional(doc, "top_k", integer(-1, MAX_TOKENS_LIMIT))
    return 0 if value is None or value == -1 else value


def _stop(doc: dict[str, Any]) -> tuple[str, ...]:
    value = doc.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (_stop_string(value, "stop"),)
    items = array(value, "stop")
    if len(items) > MAX_STOP_SEQUENCES:
        raise RequestError("stop", f"at most {MAX_STOP_SEQUENCES} sequences, got {len(items)}")
    return tuple(_stop_string(item, f"stop[{i}]") for i, item in enumerate(items))


def _stop_string(value: object, path: str) -> str:
    """Capped, since every step searches back as far as the longest stop string."""
    stop = string(value, path)
    if len(stop) > MAX_STOP_LENGTH:
        raise RequestError(path, f"at most {MAX_STOP_LENGTH} characters, got {len(stop)}")
    return stop


def _prompt(doc: dict[str, Any]) -> str | list[int]:
    """A string or a token list; a list of one of them is unwrapped, since n=1 only."""
    if "prompt" not in doc or doc["prompt"] is None:
        raise RequestError("prompt", "is required")
    value = doc["prompt"]
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        return _one_prompt(value[0], "prompt[0]")
    if isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
        raise RequestError("prompt", f"one prompt per request is supported, got {len(value)}")
    return _one_prompt(value, "prompt")


def _one_prompt(value: object, path: str) -> str | list[int]:
    if isinstance(value, str):
        return string(value, path)
    return tokens(value, path)


def _messages(doc: dict[str, Any]) -> tuple[ChatMessage, ...]:
    if doc.get("messages") is None:
        raise RequestError("messages", "is required")
    items = array(doc["messages"], "messages")
    if not items:
        raise RequestError("messages", "must hold at least one message")
    return tuple(_message(item, f"messages[{i}]") for i, item in enumerate(items))


def _message(value: object, path: str) -> ChatMessage:
    msg = mapping(value, path)
    role = required(msg, "role", string, f"{path}.role")
    if role not in CHAT_ROLES:
        raise RequestError(f"{path}.role", f"must be one of {', '.join(CHAT_ROLES)}")
    content = msg.get("content")
    if content is None and role == "assistant":
        return ChatMessage(role, "")
    return ChatMessage(role, _content(content, f"{path}.content"))


def _content(value: object, path: str) -> str:
    """A string, or text parts joined with no separator, which is what OpenAI does."""
    if value is None:
        raise RequestError(path, "is required")
    if isinstance(value, str):
        return text(value, path)
    parts = array(value, path)
    return "".join(_text_part(part, f"{path}[{i}]") for i, part in enumerate(parts))


def _text_part(value: object, path: str) -> str:
    part = mapping(value, path)
    part_type = required(part, "type", string, f"{path}.type")
    if part_type != "text":
        raise RequestError(f"{path}.type", f"only text parts are supported, got {part_type!r}")
    return required(part, "text", text, f"{path}.text")


def _embedding_inputs(doc: dict[str, Any]) -> tuple[str | list[int], ...]:
    """A string, a token list, or a list of either."""
    if doc.get("input") is None:
        raise RequestError("input", "is required")
    value = doc["input"]
    if isinstance(value, str):
        return (string(value, "input"),)
    items = array(value, "input")
    if items and all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        return (tokens(items, "input"),)
    if not items:
        raise RequestError("input", "must not be empty")
    if len(items) > MAX_EMBEDDING_INPUTS:
        raise RequestError("input", f"at most {MAX_EMBEDDING_INPUTS} inputs, got {len(items)}")
    return tuple(_one_prompt(item, f"input[{i}]") for i, item in enumerate(items))
