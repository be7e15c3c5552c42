"""Dynamic batching for single-pass models (embedding, classification), in Triton's terms.

A pass over a batch costs little more than a pass over one input, so requests wait a
little to share one. The policy, as Triton's dynamic batcher states it:

- requests are served by priority (lower first), then by arrival;
- a batch of a preferred size (or of `max_batch_size`) goes out as soon as it can be formed,
  the largest one that can;
- otherwise the queue waits, but never longer than `max_queue_delay_s` after its oldest
  request arrived; then whatever is there goes out;
- a request that waited past its queue timeout is dropped with a timeout error;
- a request that would take the queue past `max_queue_size` is rejected at once.

`next_batch` and `expired` decide; they are pure. `DynamicBatcher` is the thin asyncio
driver that feeds them its queue and runs the batches they pick, one at a time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from batching_engine.errors import QueueFullError, QueueTimeoutError
from batching_engine.throughput import RateWindow
from infergrid.errors import ContractError

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    max_batch_size: int = 32
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_s: float = 0.005
    max_queue_size: int = 256
    queue_timeout_s: float | None = None  # the default for requests that set none

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ContractError("maxBatchSize", f"must be at least 1, got {self.max_batch_size}")
        bad = [s for s in self.preferred_batch_sizes if not 1 <= s <= self.max_batch_size]
        if bad:
            raise ContractError(
                "preferredBatchSizes", f"{bad} outside 1..maxBatchSize ({self.max_batch_size})"
            )
        if self.max_queue_delay_s < 0:
            raise ContractError("maxQueueDelayMs", "must not be negative")
        if self.max_queue_size < 1:
            raise ContractError("maxQueueSize", f"must be at least 1, got {self.max_queue_size}")

    @property
    def target_sizes(self) -> tuple[int, ...]:
        """Sizes worth sending without waiting, largest first."""
        return tuple(sorted({*self.preferred_batch_sizes, self.max_batch_size}, reverse=True))


@dataclass(frozen=True, slots=True)
class Pending:
    """What the policy needs to know of one queued request."""

    arrival: float
    priority: int = 0
    deadline: float | None = None  # drop it when now reaches this


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run these queue positions together, in this order."""

    indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to send; decide again at `until`, or when a request arrives (None: only then)."""

    until: float | None


def admits(queue_depth: int, incoming: int, policy: BatchPolicy) -> bool:
    return queue_depth + incoming <= policy.max_queue_size


def expired(queue: Sequence[Pending], now: float) -> tuple[int, ...]:
    """Queue positions whose timeout has passed."""
    return tuple(i for i, p in enumerate(queue) if p.deadline is not None and now >= p.deadline)


def next_batch(queue: Sequence[Pending], policy: BatchPolicy, now: float) -> Dispatch | Wait:
    """The batch to run now, or when to look again; expired positions are never picked."""
    gone = set(expired(queue, now))
    live = sorted(
        (i for i in range(len(queue)) if i not in gone),
        key=lambda i: (queue[i].priority, queue[i].arrival, i),
    )
    if not live:
        return Wait(None)
    for size in policy.target_sizes:
        if size <= len(live):
            return Dispatch(tuple(live[:size]))
    send_at = min(queue[i].arrival for i in live) + policy.max_queue_delay_s
    if now >= send_at:
        return Dispatch(tuple(live))
    deadlines = [queue[i].deadline for i in live if queue[i].deadline is not None]
    return Wait(min([send_at, *deadlines]))


@dataclass(eq=False, slots=True)
class _Entry(Generic[T, R]):
    item: T
    pending: Pending
    future: asyncio.Future[R] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    dispatched: bool = False


class DynamicBatcher(Generic[T, R]):
    """Queues items, and runs `run` on the batches `next_batch` picks, one batch at a time.

    `run` gets the items of a batch and returns one result per item, in order; it should
    hand the work to the device's thread, so the event loop stays free while it runs.
    """

    def __init__(
        self,
        policy: BatchPolicy,
        run: Callable[[list[T]], Awaitable[list[R]]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self._run = run
        self._clock = clock
        self._queue: list[_Entry[T, R]] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.batches_run = 0
        self.completed = RateWindow()  # inputs finished, for Retry-After

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="dynamic-batcher")

    async def close(self) -> None:
        """Stop taking requests; those queued still run."""
        self._closed = True
        self._wakeup.set()
        if self._task is not None:
            await self._task

    async def submit(
        self, items: list[T], priority: int = 0, timeout_s: float | None = None
    ) -> list[R]:
        """The results of `items`, which may land in different batches."""
        if self._closed or not admits(len(self._queue), len(items), self.policy):
            raise QueueFullError(
                f"{len(self._queue)} inputs queued (max {self.policy.max_queue_size})"
            )
        now = self._clock()
        timeout_s = timeout_s if timeout_s is not None else self.policy.queue_timeout_s
        pending = Pending(now, priority, None if timeout_s is None else now + timeout_s)
        entries: list[_Entry[T, R]] = [_Entry(item, pending) for item in items]
        self._queue.extend(entries)
        self._wakeup.set()
        results = asyncio.gather(*(e.future for e in entries))
        try:
            if pending.deadline is not None:
                # The loop only looks at the queue between batches; a long batch must not
                # keep a request waiting past its timeout.
                await asyncio.wait({results}, timeout=pending.deadline - now)
                if any(not e.dispatched for e in entries):
                    raise QueueTimeoutError("waited past its queue timeout")
            return list(await results)
        finally:
            for entry in entries:
                entry.future.cancel()  # a no-op for the done ones; frees the rest

    async def _loop(self) -> None:
        while not (self._closed and not self._queue):
            self._queue = [e for e in self._queue if not e.future.done()]
            now = self._clock()
            self._expire(now)
            # Closing: nothing more will arrive to fill a batch, so waiting gains nothing.
            policy = replace(self.policy, max_queue_delay_s=0) if self._closed else self.policy
            decision = next_batch([e.pending for e in self._queue], policy, now)
            if isinstance(decision, Dispatch):
                await self._dispatch(decision.indices)
            elif not self._closed or self._queue:
                await self._sleep(decision, now)

    def _expire(self, now: float) -> None:
        gone = set(expired([e.pending for e in self._queue], now))
        for i in gone:
            self._queue[i].future.set_exception(QueueTimeoutError("waited past its queue timeout"))
        self._queue = [e for i, e in enumerate(self._queue) if i not in gone]

    async def _dispatch(self, indices: tuple[int, ...]) -> None:
        batch = [self._queue[i] for i in indices]
        for entry in batch:
            entry.dispatched = True
        taken = set(indices)
        self._queue = [e for i, e in enumerate(self._queue) if i not in taken]
        self.batches_run += 1
        try:
            results = await self._run([e.item for e in batch])
            outcomes = list(zip(batch, results, strict=True))
        except Exception as err:  # the batch's clients get the error; the loop goes on
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(err)
            return
        self.completed.add(self._clock(), len(batch))
        for entry, result in outcomes:
            if not entry.future.done():
                entry.future.set_result(result)

    async def _sleep(self, decision: Wait, now: float) -> None:
        self._wakeup.clear()
        timeout = None if decision.until is None else max(decision.until - now, 0.0)
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        except TimeoutError:
            pass
