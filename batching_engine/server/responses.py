"""OpenAI-style response bodies: completions, chat, stream chunks, embeddings and errors.

Pure builders of plain dicts; the app serialises them. Field names and values follow
OpenAI's API, so its client libraries read our answers unchanged.
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batching_engine.sequence import FinishReason

SSE_DONE = b"data: [DONE]\n\n"
_OPENAI_FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}


@dataclass(frozen=True, slots=True)
class Envelope:
    """What every body and chunk of one response shares."""

    chat: bool
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    @staticmethod
    def new(chat: bool, model: str) -> Envelope:
        prefix = "chatcmpl-" if chat else "cmpl-"
        return Envelope(chat, model, prefix + uuid.uuid4().hex)

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


def finish_reason(reason: FinishReason | None) -> str | None:
    return None if reason is None else _OPENAI_FINISH.get(reason, "stop")


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def full_response(
    env: Envelope, text: str, reason: FinishReason | None, prompt_tokens: int, output_tokens: int
) -> dict[str, Any]:
    """A non-streaming completion or chat completion."""
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason(reason)}
    if env.chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    body = env.head("chat.completion" if env.chat else "text_completion")
    return body | {"choices": [choice], "usage": usage(prompt_tokens, output_tokens)}


def stream_chunk(
    env: Envelope, text: str, reason: FinishReason | None = None, *, first: bool = False
) -> dict[str, Any]:
    """One streamed piece; a chat stream's first chunk names the role, as OpenAI's does."""
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason(reason)}
    if env.chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text or first:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text
    return env.head("chat.completion.chunk" if env.chat else "text_completion") | {
        "choices": [choice]
    }


def usage_chunk(env: Envelope, prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
    """The last chunk when the client asked for `stream_options.include_usage`."""
    body = env.head("chat.completion.chunk" if env.chat else "text_completion")
    return body | {"choices": [], "usage": usage(prompt_tokens, output_tokens)}


def embeddings_response(
    model: str, vectors: list[list[float]], encoding_format: str, prompt_tokens: int
) -> dict[str, Any]:
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(vector, encoding_format)}
        for i, vector in enumerate(vectors)
    ]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def models_response(model: str, created: int, max_model_len: int) -> dict[str, Any]:
    entry = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "infergrid",
        "max_model_len": max_model_len,
    }
    return {"object": "list", "data": [entry]}


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    """base64 is OpenAI's: the little-endian float32 bytes of the vector."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return vector
