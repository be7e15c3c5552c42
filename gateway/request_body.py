"""What the gateway reads of a request body before it forwards it to an engine, untouched
but for a stream's request for its usage (`forwarded_body`).

The gateway decides from the body: which model (the route), whether the answer streams, the
conversation's prefix (affinity) and the most model tokens the request can cost (the
tenant's bucket reserves it on admission, `reservation`). It checks
nothing else of the request, which the engine checks field by field, with one exception:
a field OpenAI's API does not define for the endpoint is refused here, naming it, so a
misspelt `max_token` fails loudly instead of being ignored. The engine's own extensions
(`top_k`, `ignore_eos`, `priority`) are known fields too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from infergrid.errors import ContractError

CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
# A prompt's tokens, bounded without a tokenizer. The engines' tokenizers (byte-level BPE,
# SentencePiece with byte fallback) cut text into tokens of at least one UTF-8 byte each, so
# a text has at most as many tokens as bytes, and a token id is one token. What the engine
# adds around the text is bounded apart: a chat template's tokens around each message (role
# markers, separators: ChatML spends 5) and once per prompt (a default system prompt, the
# generation prompt, BOS/EOS: SmolLM2's come to about 25).
MESSAGE_TOKENS: Final = 8
PROMPT_TOKENS: Final = 64
# Parsing makes a Python object of every JSON value, at up to some 90 bytes each (an empty
# object in a list), 30 times the body's bytes: orjson holds 243 MiB for 8 MiB of `{},`
# (bench/gateway_memory.py). Every value but a document's first follows a `,`, `[` or `{`,
# so their count bounds the values; counted in the raw bytes (strings too, which only
# overcounts) it costs a few ms. At this bound a parse of 8 MiB holds 40 MiB at most; a real
# request's prompt fits a model's context and comes nowhere near it (prose has a comma
# every 50 bytes or so, a token id takes one).
PARSED_VALUES: Final = 1 << 18
# An unknown field is named by itself when its name could be a field's (OpenAI's are short
# snake_case); any other name (empty, "[", a megabyte, a lone surrogate) is named `body`
# and shown cut short, so a refusal names a field a client can find and echoes little.
FIELD_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
NAME_SHOWN: Final = 64
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
    EMBEDDINGS: frozenset(("model", "input", "encoding_format", "dimensions", "user", "priority")),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    model: str
    stream: bool
    prefix_text: str  # the conversation's start, for affinity; empty for embeddings
    prompt_tokens: int  # at most this many: see MESSAGE_TOKENS
    max_tokens: int | None  # per answer, as asked; None: until the context is full
    copies: int  # answers generated (`n`); 0 for embeddings, which generate none
    usage_asked: bool  # a stream whose client asked for the usage chunk


def parse_request(raw: bytes, endpoint: str) -> ParsedRequest:
    """The fields the gateway routes by; ContractError names the field that is wrong."""
    doc = _json(raw)
    if not isinstance(doc, dict):
        raise ContractError("body", f"expected a JSON object, got {_kind(doc)}")
    known = FIELDS[endpoint]
    for key in doc:
        if key not in known:
            raise _unknown(key, endpoint)
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise ContractError("model", "is required: the name of a served model (GET /v1/models)")
    stream = doc.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise ContractError("stream", f"expected true or false, got {_kind(stream)}")
    options = doc.get("stream_options")
    embeddings = endpoint == EMBEDDINGS
    return ParsedRequest(
        model=model,
        stream=bool(stream),
        prefix_text="" if embeddings else _prompt_text(doc, endpoint),
        prompt_tokens=_prompt_tokens(doc, endpoint),
        max_tokens=None if embeddings else _max_tokens(doc),
        copies=0 if embeddings else _copies(doc),
        usage_asked=isinstance(options, dict) and options.get("include_usage") is True,
    )


def reservation(parsed: ParsedRequest, context_tokens: int | None, default_answer: int) -> int:
    """The most model tokens the request can cost, which the tenant's bucket holds back until
    the engine reports what it spent. Each answer ends at `max_tokens` or where prompt and
    answer fill the model's context (`context_tokens`), so n answers with a prompt of p
    tokens come to at most p + n * max_tokens, and at most n * context (p + n * (context - p)
    <= n * context for n >= 1). Without a known context, an answer without max_tokens is
    bounded by `default_answer` only, which the engine's own context may exceed."""
    if parsed.copies == 0:
        return parsed.prompt_tokens
    if context_tokens is None:
        answer = parsed.max_tokens if parsed.max_tokens is not None else default_answer
        return parsed.prompt_tokens + parsed.copies * answer
    whole = parsed.copies * context_tokens
    if parsed.max_tokens is None:
        return whole
    return min(parsed.prompt_tokens + parsed.copies * parsed.max_tokens, whole)


def forwarded_body(raw: bytes, parsed: ParsedRequest) -> bytes:
    """The body as the engine gets it: as the client sent it, but that a stream asks for
    `stream_options.include_usage`, so that it ends with the engine's usage chunk, which
    settles the tenant's bucket (the proxy keeps the chunk from a client that did not ask).
    The option is appended as the object's last member, where JSON parsers' last-wins rule
    lets it override the client's own `stream_options`."""
    if not parsed.stream or parsed.usage_asked:
        return raw
    return with_member(raw, "stream_options", {"include_usage": True})


def with_member(raw: bytes, name: str, value: Any) -> bytes:
    """The parsed JSON object `raw` with `name: value` appended as its last member, without
    parsing it again: JSON parsers keep the last of repeated members (the engine's do), so it
    overrides the client's own. `raw` holds at least `model`, so the object is not empty."""
    end = raw.rindex(b"}")  # the object's own: only whitespace may follow it
    return raw[:end] + b"," + orjson.dumps(name) + b":" + orjson.dumps(value) + b"}"


def _json(raw: bytes) -> Any:
    """orjson, fast; the standard parser for what orjson refuses but JSON allows (a lone
    surrogate escape, which the engine accepts too). NaN and Infinity are not JSON."""
    values = raw.count(b",") + raw.count(b"[") + raw.count(b"{")
    if values > PARSED_VALUES:
        raise ContractError(
            "body", f"holds up to {values} JSON values (every ',', '[' and '{{' counted), over "
            f"the {PARSED_VALUES} the gateway parses"
        )  # fmt: skip
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        first = err
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise ContractError("body", f"not valid JSON: {first}") from None


def _unknown(key: str, endpoint: str) -> ContractError:
    if FIELD_NAME.fullmatch(key):
        return ContractError(key, f"unknown field for {endpoint}")
    shown = json.dumps(key[:NAME_SHOWN]) + ("..." if len(key) > NAME_SHOWN else "")
    return ContractError("body", f"holds a field {shown}, unknown for {endpoint}")


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
        content = "".join(t for p in content if isinstance(p, dict)
                          and isinstance(t := p.get("text"), str))  # fmt: skip
    if not isinstance(content, str):
        content = ""
    return f"{role if isinstance(role, str) else ''}\x00{content}\x00"


def _prompt_tokens(doc: dict[str, Any], endpoint: str) -> int:
    """At most how many tokens the engine makes of the prompt (see MESSAGE_TOKENS); a wrong
    shape counts what it holds, and is the engine's to refuse."""
    if endpoint == CHAT:
        messages = doc.get("messages")
        items = messages if isinstance(messages, list) else []
        return PROMPT_TOKENS + sum(_message_tokens(m) for m in items)
    value = doc.get("prompt" if endpoint == COMPLETIONS else "input")
    if isinstance(value, list) and any(isinstance(v, str | list) for v in value):
        return PROMPT_TOKENS + sum(MESSAGE_TOKENS + _tokens(v) for v in value)  # one per input
    return PROMPT_TOKENS + _tokens(value)


def _message_tokens(message: object) -> int:
    if not isinstance(message, dict):
        return MESSAGE_TOKENS
    return MESSAGE_TOKENS + _tokens(message.get("role")) + _tokens(message.get("content"))


def _tokens(value: object, depth: int = 0) -> int:
    """A text's UTF-8 bytes, or one per token id, summed over a list (of token ids, of
    content parts) and no deeper than any shape the engine takes."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if _whole(value):
        return 1
    if isinstance(value, dict):
        text = value.get("text")
        return _tokens(text) if isinstance(text, str) else 0
    if isinstance(value, list) and depth < 2:
        return sum(_tokens(v, depth + 1) for v in value)
    return 0


def _max_tokens(doc: dict[str, Any]) -> int | None:
    for key in ("max_tokens", "max_completion_tokens"):
        value = doc.get(key)
        if _whole(value) and value > 0:
            return value
    return None


def _copies(doc: dict[str, Any]) -> int:
    """`n`; the engine refuses a bad one, so a bad one counts as 1 here."""
    n = doc.get("n", 1)
    return n if _whole(n) and n > 0 else 1


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), "number" if isinstance(value, int | float) else "null"
    )
