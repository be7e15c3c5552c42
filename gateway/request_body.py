"""What the gateway reads of a request body before it forwards it, untouched, to an engine.

The gateway decides from the body: which model (the route), whether the answer streams, the
conversation's prefix (affinity) and a token estimate (the tenant's bucket). It checks
nothing else of the request, which the engine checks field by field, with one exception:
a field OpenAI's API does not define for the endpoint is refused here, naming it, so a
misspelt `max_token` fails loudly instead of being ignored. The engine's own extensions
(`top_k`, `ignore_eos`, `priority`) are known fields too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from infergrid.errors import ContractError

CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
CHARS_PER_TOKEN: Final = 4  # an estimate only: the gateway carries no tokenizer
_SAMPLING: Final = (
    "model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop",
    "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "user", "seed",
    "top_k", "ignore_eos", "priority",
)  # fmt: skip
FIELDS: Final[Mapping[str, frozenset[str]]] = {
    CHAT: frozenset((
        *_SAMPLING, "messages", "max_completion_tokens", "top_logprobs", "response_format",
        "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
        "service_tier", "store", "metadata", "modalities", "reasoning_effort",
        "prompt_cache_key", "safety_identifier", "verbosity", "prediction", "audio",
        "web_search_options",
    )),
    COMPLETIONS: frozenset((*_SAMPLING, "prompt", "suffix", "echo", "best_of")),
    EMBEDDINGS: frozenset(("model", "input", "encoding_format", "dimensions", "user")),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    model: str
    stream: bool
    prefix_text: str  # the conversation's start, for affinity; empty for embeddings
    estimate: float  # model tokens the request may cost: the prompt's and the answer's


def parse_request(raw: bytes, endpoint: str, default_max_tokens: int) -> ParsedRequest:
    """The fields the gateway routes by; ContractError names the field that is wrong."""
    doc = _json(raw)
    if not isinstance(doc, dict):
        raise ContractError("body", f"expected a JSON object, got {_kind(doc)}")
    known = FIELDS[endpoint]
    for key in doc:
        if key not in known:
            raise ContractError(key, f"unknown field for {endpoint}")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise ContractError("model", "is required: the name of a served model (GET /v1/models)")
    stream = doc.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise ContractError("stream", f"expected true or false, got {_kind(stream)}")
    text = _prompt_text(doc, endpoint)
    answer = 0 if endpoint == EMBEDDINGS else _max_tokens(doc, default_max_tokens)
    estimate = math.ceil(len(text) / CHARS_PER_TOKEN) + answer
    return ParsedRequest(model, bool(stream), "" if endpoint == EMBEDDINGS else text, estimate)


def _json(raw: bytes) -> Any:
    """orjson, fast; the standard parser for what orjson refuses but JSON allows (a lone
    surrogate escape, which the engine accepts too). NaN and Infinity are not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        first = err
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise ContractError("body", f"not valid JSON: {first}") from None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _prompt_text(doc: dict[str, Any], endpoint: str) -> str:
    """The request's text as one string; a wrong shape here is the engine's to name."""
    if endpoint == CHAT:
        messages = doc.get("messages")
        if not isinstance(messages, list):
            return ""
        return "".join(_message_text(m) for m in messages)
    value = doc.get("prompt" if endpoint == COMPLETIONS else "input")
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(v for v in value if isinstance(v, str)) or " " * len(value)
    return ""


def _message_text(message: object) -> str:
    if not isinstance(message, dict):
        return ""
    role, content = message.get("role"), message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        content = ""
    return f"{role if isinstance(role, str) else ''}\x00{content}\x00"


def _max_tokens(doc: dict[str, Any], default: int) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = doc.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            n = doc.get("n", 1)
            copies = n if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 128 else 1
            return value * copies
    return default


def _kind(value: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), "number" if isinstance(value, int | float) else "null"
    )
