"""Continuous batching: which sequences run in the next step, and how many tokens each.

Each step serves running decodes first, then prefills already under way, then admits
waiting sequences by (priority, arrival) while the sequence and token budgets allow; a long
prompt is split over steps (chunked prefill). When a decode needs a block and none is free,
the least important running sequence (lowest priority, newest) is preempted by recompute:
it drops its KV and goes back to the front of its class in the waiting queue, keeping its
output, which it prefills again on re-admission. The oldest, most urgent sequence is never
the victim while others run, and every sequence fits the cache alone (`add` checks), so
every admitted sequence finishes. The scheduler reads no clock: callers pass `now`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from batching_engine.block_manager import BlockManager
from batching_engine.config import EngineConfig
from batching_engine.errors import InvalidRequestError, QueueFullError, RequestTooLongError
from batching_engine.sequence import FinishReason, Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledBatch:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    timed_out: list[Sequence] = field(default_factory=list)
    num_preemptions: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_cached_tokens: int = 0  # prefix-cache hits of the sequences admitted this step

    def add(self, seq: Sequence, num_tokens: int) -> None:
        if _is_decoding(seq):
            self.num_decode_tokens += num_tokens
        else:
            self.num_prefill_tokens += num_tokens
        self.scheduled.append((seq, num_tokens))


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: list[Sequence] = []  # sorted by _waiting_key
        self.running: list[Sequence] = []

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        """Queue a new request, or refuse it now rather than fail it later."""
        self._check_request(seq)
        if len(self.waiting) >= self.config.max_queue_size:
            raise QueueFullError(f"{len(self.waiting)} requests are waiting, the most allowed")
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=_waiting_key)

    def abort(self, seq_id: int) -> Sequence | None:
        """Finish the sequence as aborted and free its blocks; None when it is not here."""
        for seq in (*self.waiting, *self.running):
            if seq.seq_id == seq_id:
                self.finish(seq, FinishReason.ABORT)
                return seq
        return None

    def schedule(self, now: float) -> ScheduledBatch:
        batch = ScheduledBatch(timed_out=self._expire(now))
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_running(batch, budget)
        if batch.num_preemptions == 0:  # cache is short: admitting would preempt again
            self._admit(batch, budget)
        return batch

    def mark_computed(self, seq: Sequence, num_tokens: int) -> None:
        """The runner wrote the KV of `num_tokens` more tokens of `seq`."""
        seq.num_computed_tokens += num_tokens
        assert seq.num_computed_tokens <= seq.num_tokens, f"sequence {seq.seq_id} overcomputed"
        self.block_manager.cache_computed_blocks(seq)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.block_manager.deallocate(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason

    def _check_request(self, seq: Sequence) -> None:
        limit, params = self.config.max_model_len, seq.params
        if not 0 <= seq.priority < self.config.priority_levels:
            highest = self.config.priority_levels - 1
            raise InvalidRequestError(
                "priority", f"must be from 0 to {highest}, got {seq.priority}"
            )
        if params.max_tokens < 1:
            raise InvalidRequestError("max_tokens", f"must be at least 1, got {params.max_tokens}")
        if not 1 <= seq.num_prompt_tokens < limit:
            raise RequestTooLongError(
                "prompt", f"must hold 1 to {limit - 1} tokens (max_model_len {limit} leaves "
                f"room for one output token), got {seq.num_prompt_tokens}"
            )  # fmt: skip
        self._check_fits_cache(seq)

    def _check_fits_cache(self, seq: Sequence) -> None:
        """Alone in the cache, the sequence must reach its last token, or it would never finish."""
        bm, limit = self.block_manager, self.config.max_model_len
        last = min(seq.num_prompt_tokens + seq.params.max_tokens, limit)
        capacity = bm.num_blocks * bm.block_size
        if bm.blocks_for(seq.num_prompt_tokens) > bm.num_blocks:
            raise RequestTooLongError(
                "prompt", f"{seq.num_prompt_tokens} tokens exceed the KV cache's {capacity}"
            )
        if bm.blocks_for(last - 1) > bm.num_blocks:
            raise RequestTooLongError(
                "max_tokens", f"prompt plus max_tokens is {last} tokens; the KV cache holds "
                f"{capacity}, so at most {capacity + 1 - seq.num_prompt_tokens} fit"
            )  # fmt: skip

    def _expire(self, now: float) -> list[Sequence]:
        """Time out never-admitted waiting sequences; preempted ones were accepted and stay."""
        expired = [seq for seq in self.waiting if _expired(seq, now, self.config.queue_timeout_s)]
        for seq in expired:
            self.finish(seq, FinishReason.TIMEOUT)
        return expired

    def _schedule_running(self, batch: ScheduledBatch, budget: int) -> int:
        """Decodes, then prefills under way; each decode may preempt to get its block."""
        order = sorted(self.running, key=_rank)
        for seq in (s for s in order if _is_decoding(s)):
            if seq.status is SequenceStatus.RUNNING and budget and self._make_room(seq, batch):
                self.block_manager.may_append(seq)
                batch.add(seq, 1)
                budget -= 1
        for seq in (s for s in order if not _is_decoding(s)):
            if seq.status is SequenceStatus.RUNNING and budget:
                num_tokens = min(seq.num_uncomputed_tokens, budget)
                batch.add(seq, num_tokens)
                budget -= num_tokens
        return budget

    def _make_room(self, seq: Sequence, batch: ScheduledBatch) -> bool:
        """Preempt until `seq` can grow; False when `seq` itself had to go."""
        scheduled = {s.seq_id for s, _ in batch.scheduled}
        while not self.block_manager.can_append(seq):
            victim = max((s for s in self.running if s.seq_id not in scheduled), key=_rank)
            self._preempt(victim)
            batch.num_preemptions += 1
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        bisect.insort(self.waiting, seq, key=_waiting_key)

    def _admit(self, batch: ScheduledBatch, budget: int) -> None:
        """In queue order; the first sequence that does not fit stops the rest (no overtaking)."""
        bm = self.block_manager
        while self.waiting and budget and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if not bm.can_allocate(seq):
                break
            self.waiting.pop(0)
            bm.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            num_tokens = min(seq.num_uncomputed_tokens, budget)
            batch.add(seq, num_tokens)
            batch.num_cached_tokens += seq.num_cached_tokens
            budget -= num_tokens


def _is_decoding(seq: Sequence) -> bool:
    return seq.num_uncomputed_tokens == 1 and bool(seq.output_token_ids)


def _rank(seq: Sequence) -> tuple[int, float, int]:
    """Most protected first: urgent, then old. The last running one is the next victim."""
    return (seq.priority, seq.arrival_time, seq.seq_id)


def _waiting_key(seq: Sequence) -> tuple[int, int, float, int]:
    """By priority; within a class, preempted sequences first (they were already running)."""
    return (seq.priority, 0 if seq.num_preemptions else 1, seq.arrival_time, seq.seq_id)


def _expired(seq: Sequence, now: float, default_timeout_s: float) -> bool:
    timeout = seq.queue_timeout_s if seq.queue_timeout_s is not None else default_timeout_s
    return seq.num_preemptions == 0 and now - seq.arrival_time > timeout
