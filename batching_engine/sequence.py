"""One request's state as it moves through the scheduler, the block manager and the runner.

The contract between the three: the scheduler picks `(sequence, num_new_tokens)` pairs; the
runner computes the KV of `token_ids[num_computed_tokens : num_computed_tokens + n]` into the
slots named by `block_table`, and samples a token only when that chunk reaches the end of
`token_ids` (a prefill chunk that stops short samples nothing).
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

_ids = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"  # EOS or a stop string
    LENGTH = "length"  # max_tokens, or the model's context limit
    ABORT = "abort"  # the client went away, or the server is shutting down
    TIMEOUT = "timeout"  # waited in the queue longer than its timeout


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request decoding settings; temperature 0 means greedy."""

    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(eq=False, slots=True)
class Sequence:
    """A generation request: its prompt, what it has produced, and where its KV lives."""

    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    priority: int = 0  # lower runs first; ties go to the earlier arrival
    arrival_time: float = field(default_factory=time.monotonic)
    queue_timeout_s: float | None = None
    seq_id: int = field(default_factory=lambda: next(_ids))
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    num_cached_tokens: int = 0  # of those, tokens found in the prefix cache at admission
    num_preemptions: int = 0
    text_end: int | None = None  # a stop string starts here in the output text: cut it here

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
