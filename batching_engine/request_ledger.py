"""Per-request times on the worker thread, turned into the latency and token metrics.

The worker knows when each request was first scheduled, when each of its tokens came out
and when it ended; the step loop reports those moments here and never touches a histogram
itself. Only the worker calls a ledger, except `completions_per_s`, which is locked.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from batching_engine.engine import StepOutput
from batching_engine.metrics import EngineMetrics, RequestStatus
from batching_engine.sequence import FinishReason, Sequence, SequenceStatus
from batching_engine.throughput import RateWindow

S = TypeVar("S")  # what the caller keeps per request (the async engine: its stream)

_STATUS = {
    FinishReason.STOP: RequestStatus.SUCCESS,
    FinishReason.LENGTH: RequestStatus.SUCCESS,
    FinishReason.ABORT: RequestStatus.ABORTED,
    FinishReason.TIMEOUT: RequestStatus.TIMEOUT,
}


@dataclass(slots=True)
class _Entry(Generic[S]):
    seq: Sequence
    owner: S
    scheduled: bool = False
    first_token: float | None = None
    last_token: float | None = None


class RequestLedger(Generic[S]):
    def __init__(self, metrics: EngineMetrics) -> None:
        self.metrics = metrics
        self._entries: dict[int, _Entry[S]] = {}
        self._completions = RateWindow()
        self._rate_lock = threading.Lock()

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._entries

    def admitted(self, seq: Sequence, owner: S) -> None:
        self._entries[seq.seq_id] = _Entry(seq, owner)
        self.metrics.prompt_tokens.inc(seq.num_prompt_tokens)

    def after_step(self, now: float) -> None:
        """Queue time ends at the first step that computed part of a request."""
        for entry in self._entries.values():
            seq = entry.seq
            started = seq.status is SequenceStatus.RUNNING or seq.num_computed_tokens
            if not entry.scheduled and (started or seq.output_token_ids):
                entry.scheduled = True
                self.metrics.scheduled(seq.arrival_time, now)

    def output(self, out: StepOutput, now: float) -> S | None:
        """Record one step output; the owner of its request, or None if not ours."""
        entry = self._entries.get(out.seq.seq_id)
        if entry is None:
            return None
        if out.new_token_ids:
            self._tokens(entry, len(out.new_token_ids), now)
        if out.finished:
            del self._entries[out.seq.seq_id]
            self._finished(entry, out.finish_reason or FinishReason.STOP, now)
        return entry.owner

    def aborted(self, seq_id: int) -> S | None:
        """Forget an aborted request; its owner, or None if it had already ended."""
        entry = self._entries.pop(seq_id, None)
        if entry is not None:
            self.metrics.request_finished(RequestStatus.ABORTED)
        return None if entry is None else entry.owner

    def fail_all(self) -> Iterator[tuple[int, S]]:
        """Forget every request as failed (a step raised); yields (seq id, owner)."""
        failed, self._entries = self._entries, {}
        for seq_id, entry in failed.items():
            self.metrics.request_finished(RequestStatus.ERROR)
            yield seq_id, entry.owner

    def completions_per_s(self, now: float) -> float:
        with self._rate_lock:
            return self._completions.rate(now)

    def _tokens(self, entry: _Entry[S], count: int, now: float) -> None:
        self.metrics.generation_tokens.inc(count)
        if entry.first_token is None:
            entry.first_token = now
            self.metrics.first_token(entry.seq.arrival_time, now)
        elif entry.last_token is not None:
            self.metrics.next_token(entry.last_token, now)
        entry.last_token = now

    def _finished(self, entry: _Entry[S], reason: FinishReason, now: float) -> None:
        self.metrics.request_finished(_STATUS[reason])
        if entry.first_token is None or reason not in (FinishReason.STOP, FinishReason.LENGTH):
            return
        outputs = len(entry.seq.output_token_ids)
        self.metrics.completed(entry.seq.arrival_time, entry.first_token, now, outputs)
        with self._rate_lock:
            self._completions.add(now)
