"""The generation loop: each step is schedule, run, postprocess.

The engine owns no policy: the scheduler decides what runs, the runner (the only part that
touches the GPU) computes KV and samples, and postprocess appends the sampled tokens and
decides which sequences are done. Per-step counts land in `stats` for the server's metrics.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from batching_engine.block_manager import BlockManager
from batching_engine.config import EngineConfig
from batching_engine.errors import InvalidRequestError
from batching_engine.scheduler import ScheduledBatch, Scheduler
from batching_engine.sequence import FinishReason, SamplingParams, Sequence
from batching_engine.stop import StopWatch, TextStream

if TYPE_CHECKING:
    import torch


class Runner(Protocol):
    """Computes KV for scheduled chunks into the slots their block tables name.

    `execute` returns, per `(sequence, num_new_tokens)`, the sampled next token when the
    chunk reaches the end of `sequence.token_ids`, else None. It must not change the
    sequences: the engine advances them after the step.
    """

    num_kv_blocks: int
    device: torch.device  # picks the step budget where the config leaves it to the device
    # Whether the cache's memory is committed only as blocks are first written (the CPU's):
    # then the block manager reuses blocks used before first (`BlockManager.touched_first`).
    kv_cache_commits_lazily: bool

    def execute(self, batch: list[tuple[Sequence, int]]) -> list[int | None]: ...


@dataclass(frozen=True, slots=True)
class StepOutput:
    seq: Sequence
    new_token_ids: list[int]
    finished: bool
    finish_reason: FinishReason | None = None


@dataclass(frozen=True, slots=True)
class EngineStats:
    """One step's work (counts to add to counters) and the state after it (gauges)."""

    prefill_tokens: int = 0
    decode_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    preemptions: int = 0
    timeouts: int = 0
    batch_size: int = 0
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        runner: Runner,
        eos_token_ids: Iterable[int],
        detokenizer: Callable[[], TextStream] | None = None,
    ) -> None:
        self.config = config.for_device(runner.device.type)
        self.runner = runner
        self.eos_token_ids = frozenset(eos_token_ids)
        self.detokenizer = detokenizer  # a new output text stream, for stop strings
        self.block_manager = BlockManager(
            runner.num_kv_blocks,
            self.config.block_size,
            self.config.enable_prefix_caching,
            touched_first=runner.kv_cache_commits_lazily,
        )
        self.scheduler = Scheduler(self.config, self.block_manager)
        self.stats = EngineStats()
        self._stop_watches: dict[int, StopWatch] = {}  # by seq id

    def add_request(self, seq: Sequence) -> None:
        """Queue `seq`; raises QueueFullError or InvalidRequestError, leaving nothing behind."""
        if seq.params.stop and self.detokenizer is None:
            raise InvalidRequestError("stop", "stop strings need a tokenizer to detokenize")
        self.scheduler.add(seq)

    def abort(self, seq_id: int) -> bool:
        self._stop_watches.pop(seq_id, None)
        return self.scheduler.abort(seq_id) is not None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self, now: float | None = None) -> list[StepOutput]:
        batch = self.scheduler.schedule(time.monotonic() if now is None else now)
        tokens = self.runner.execute(batch.scheduled) if batch.scheduled else []
        outputs = self._postprocess(batch, tokens)
        self.stats = self._stats(batch)
        return outputs

    def generate(self, requests: Iterable[tuple[list[int], SamplingParams]]) -> list[list[int]]:
        """Run every request to the end (offline use: tests, benchmarks); output ids in order.

        Requests enter as the queue has room, and never time out.
        """
        seqs = [Sequence(list(ids), params, queue_timeout_s=math.inf) for ids, params in requests]
        pending = iter(seqs)
        next_seq = next(pending, None)
        while next_seq is not None or self.has_unfinished():
            while next_seq is not None and self.scheduler.num_waiting < self.config.max_queue_size:
                self.add_request(next_seq)
                next_seq = next(pending, None)
            self.step()
        return [seq.output_token_ids for seq in seqs]

    def _postprocess(self, batch: ScheduledBatch, tokens: list[int | None]) -> list[StepOutput]:
        if len(tokens) != len(batch.scheduled):
            raise RuntimeError(f"runner returned {len(tokens)} tokens for {len(batch.scheduled)}")
        outputs = [StepOutput(seq, [], True, FinishReason.TIMEOUT) for seq in batch.timed_out]
        for (seq, num_tokens), token in zip(batch.scheduled, tokens, strict=True):
            reaches_end = seq.num_computed_tokens + num_tokens == seq.num_tokens
            if (token is not None) != reaches_end:
                chunk = "ends" if reaches_end else "stops short"
                raise RuntimeError(
                    f"runner: sequence {seq.seq_id} got {token} for a chunk that {chunk}"
                )
            self.scheduler.mark_computed(seq, num_tokens)
            if token is None:
                continue
            seq.output_token_ids.append(token)
            reason = self._finish_reason(seq)
            if reason is not None:
                self.scheduler.finish(seq, reason)
                self._stop_watches.pop(seq.seq_id, None)
            outputs.append(StepOutput(seq, [token], reason is not None, reason))
        return outputs

    def _finish_reason(self, seq: Sequence) -> FinishReason | None:
        params = seq.params
        if not params.ignore_eos and seq.output_token_ids[-1] in self.eos_token_ids:
            return FinishReason.STOP
        if params.stop and self._matches_stop(seq):
            return FinishReason.STOP
        if len(seq.output_token_ids) >= params.max_tokens:
            return FinishReason.LENGTH
        if seq.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None

    def _matches_stop(self, seq: Sequence) -> bool:
        """Search the new text only; on a match, record where the returned text ends."""
        watch = self._stop_watches.get(seq.seq_id)
        if watch is None:
            assert self.detokenizer is not None, "add_request refuses stop strings without one"
            watch = self._stop_watches[seq.seq_id] = StopWatch(seq.params.stop, self.detokenizer())
        at = watch.check(seq.output_token_ids)
        if at is None:
            return False
        seq.text_end = at
        return True

    def _stats(self, batch: ScheduledBatch) -> EngineStats:
        return EngineStats(
            prefill_tokens=batch.num_prefill_tokens,
            decode_tokens=batch.num_decode_tokens,
            prefix_cache_hit_tokens=batch.num_cached_tokens,
            preemptions=batch.num_preemptions,
            timeouts=len(batch.timed_out),
            batch_size=len(batch.scheduled),
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            kv_usage=self.block_manager.usage,
        )
