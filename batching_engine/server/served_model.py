"""What the server knows of the model it serves, and the checks of a request against it.

These are the limits the body parser cannot know: the model's name and task, its
vocabulary, its context length, the engine's priority classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from batching_engine.server.errors import ModelNotFoundError
from batching_engine.server.json_fields import RequestError
from batching_engine.tokenizer import Tokenizer

GENERATION_TASK = "text-generation"


class Embedder(Protocol):
    """The part of ModelRunner the server calls: vectors for whole inputs, on the worker, and
    the release of its tensor-parallel workers at the end."""

    def embed(self, token_ids: list[list[int]]) -> Any: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    task: str
    tokenizer: Tokenizer
    runner: Embedder
    vocab_size: int
    max_model_len: int
    created: int = 0

    def check_name(self, asked: str | None) -> None:
        """A body may leave `model` out; if it names one, it must be this one."""
        if asked is not None and asked != self.name:
            raise ModelNotFoundError(
                "model",
                f"the model {asked!r} does not exist here; this engine serves {self.name!r}",
            )

    def check_generates(self) -> None:
        if self.task != GENERATION_TASK:
            raise RequestError(
                "model", f"{self.name!r} is a {self.task} model; it does not generate text"
            )

    def check_chars(self, text: str, path: str, max_tokens: int) -> None:
        """Before tokenizing: a text whose length alone proves it over `max_tokens` tokens
        is refused at once, since tokenizing megabytes takes seconds (`token_bound`)."""
        bound = self.tokenizer.token_bound
        if bound is not None and (least := bound.least_tokens(text)) > max_tokens:
            raise RequestError(
                path, f"must hold at most {max_tokens} tokens; its {len(text)} characters make "
                f"at least {least}, since no token of this model covers more than "
                f"{bound.max_chars} bytes"
            )  # fmt: skip

    def check_length(self, ids: list[int], path: str) -> None:
        """After tokenizing, naming the field the text came from: the scheduler checks the
        length again, but knows no field, and a chat body has no `prompt`."""
        most = self.max_model_len - 1
        if len(ids) > most:
            raise RequestError(
                path, f"must hold at most {most} tokens (max_model_len {self.max_model_len} "
                f"leaves room for one output token), got {len(ids)}"
            )  # fmt: skip

    def check_tokens(self, ids: list[int], path: str) -> None:
        for i, token in enumerate(ids):
            if token >= self.vocab_size:
                raise RequestError(
                    f"{path}[{i}]",
                    f"token id {token} is outside the vocabulary (0..{self.vocab_size - 1})",
                )


def check_priority(priority: int, levels: int) -> None:
    if not 0 <= priority < levels:
        raise RequestError("priority", f"must be from 0 to {levels - 1}, got {priority}")
