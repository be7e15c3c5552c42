"""The sync LLMEngine's step loop on one worker thread, with asyncio streams in front.

Only the worker touches the engine and the model: requests to admit, aborts, and single-pass
jobs (embedding batches) reach it through lists under one condition variable, and it takes
them between steps. It sleeps on that condition when there is nothing to do. Results go back
to the event loop with `call_soon_threadsafe`, one call per step, into per-request queues.

Admission is answered before any output: `submit` returns a stream only once the scheduler
took the sequence, so a full queue becomes a 429 before the response starts. `drain` stops
admission and waits until every accepted stream has seen its end.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from batching_engine.device import use_device
from batching_engine.engine import LLMEngine
from batching_engine.errors import EngineDrainingError, QueueFullError
from batching_engine.metrics import EngineMetrics
from batching_engine.request_ledger import RequestLedger
from batching_engine.sequence import FinishReason, Sequence
from batching_engine.throughput import retry_after_s

if TYPE_CHECKING:
    import torch

log = logging.getLogger("infergrid.engine")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Delta:
    """New output of one request; the last one has `finish_reason` (or `error`) set."""

    token_ids: list[int]
    finish_reason: FinishReason | None = None
    error: str | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None


class RequestStream:
    """The deltas of one accepted request, in order, ending after the final one."""

    def __init__(self, seq: Sequence, on_end: Callable[[int], None]) -> None:
        self.seq = seq
        self._queue: asyncio.Queue[Delta] = asyncio.Queue()
        self._on_end = on_end
        self._done = False

    def put(self, delta: Delta) -> None:
        if not self._done:
            self._queue.put_nowait(delta)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Delta:
        if self._done:
            raise StopAsyncIteration
        delta = await self._queue.get()
        if delta.final:
            self.close()
        return delta

    @property
    def done(self) -> bool:
        return self._done

    def close(self) -> None:
        """No more deltas wanted: the end arrived, or the reader gave up (and aborted)."""
        if not self._done:
            self._done = True
            self._on_end(self.seq.seq_id)


@dataclass(slots=True)
class _Inbox:
    """Work handed to the worker; guarded by AsyncEngine._cond."""

    adds: list[tuple[Sequence, RequestStream, asyncio.Future[RequestStream]]] = field(
        default_factory=list
    )
    aborts: list[int] = field(default_factory=list)
    jobs: list[tuple[Callable[[], Any], asyncio.Future[Any], int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.adds or self.aborts or self.jobs)


class AsyncEngine:
    def __init__(
        self,
        engine: LLMEngine | None,
        metrics: EngineMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        device: str | torch.device | None = None,
    ) -> None:
        """`device` is the model's: the worker makes it its current CUDA device."""
        self.engine = engine
        self.device = device
        self.metrics = metrics or EngineMetrics(clock)
        self._clock = clock
        self._cond = threading.Condition()
        self._inbox = _Inbox()
        self._stopping = False
        self._ledger: RequestLedger[RequestStream] = RequestLedger(self.metrics)  # worker-owned
        self._open: set[int] = set()  # event-loop-owned: accepted streams not yet ended
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.accepting = True

    # Lifecycle.

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._work, name="engine-worker", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    async def drain(self) -> None:
        """Take no new requests; return once every accepted one has ended."""
        self.accepting = False
        await self._idle.wait()

    async def close(self) -> None:
        """Stop the worker once it has nothing left; call after `drain`."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    # Requests.

    @property
    def queue_depth(self) -> int:
        waiting = self.engine.scheduler.num_waiting if self.engine else 0
        return waiting + len(self._inbox.adds)

    @property
    def num_running(self) -> int:
        return self.engine.scheduler.num_running if self.engine else 0

    @property
    def kv_usage(self) -> float:
        return self.engine.block_manager.usage if self.engine else 0.0

    @property
    def num_open(self) -> int:
        return len(self._open)

    async def submit(self, seq: Sequence) -> RequestStream:
        """Admit `seq`; raises QueueFullError or InvalidRequestError, or
        EngineDrainingError, before any output."""
        if not self.accepting:
            raise EngineDrainingError("the engine is draining")
        self.check_room()
        loop = self._require_loop()
        stream = RequestStream(seq, self._stream_ended)
        admitted: asyncio.Future[RequestStream] = loop.create_future()
        with self._cond:
            self._inbox.adds.append((seq, stream, admitted))
            self._cond.notify()
        try:
            await admitted
        except asyncio.CancelledError:
            self.abort(seq.seq_id)  # the client left while we were admitting it
            raise
        self._open.add(seq.seq_id)
        self._idle.clear()
        return stream

    def check_room(self) -> None:
        """Refuse at once, on the event loop, when the queue is already full: under overload
        most requests are refused, and each must cost little and never wake the worker.
        The scheduler still has the last word when the worker admits the request."""
        if self.engine is None:
            raise RuntimeError("this engine serves a single-pass model; it has no LLMEngine")
        if self.queue_depth >= self.engine.config.max_queue_size:
            raise QueueFullError(f"{self.queue_depth} requests are waiting, the most allowed")

    def abort(self, seq_id: int) -> None:
        """Cancel a request: the worker finishes it as aborted and frees its KV blocks."""
        self._open.discard(seq_id)
        self._set_idle_if_empty()
        with self._cond:
            self._inbox.aborts.append(seq_id)
            self._cond.notify()

    async def run_job(self, fn: Callable[[], T], batch_size: int = 0) -> T:
        """`fn()` on the worker between steps: the device runs one thing at a time."""
        future: asyncio.Future[T] = self._require_loop().create_future()
        with self._cond:
            self._inbox.jobs.append((fn, future, batch_size))
            self._cond.notify()
        return await future

    def retry_after_s(self) -> int:
        """Seconds a rejected client should wait: the queue ahead over recent completions."""
        rate = self._ledger.completions_per_s(self._clock())
        return retry_after_s(self.queue_depth, rate)

    def _stream_ended(self, seq_id: int) -> None:
        self._open.discard(seq_id)
        self._set_idle_if_empty()

    def _set_idle_if_empty(self) -> None:
        if not self._open:
            self._idle.set()

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("AsyncEngine.start() was not called")
        return self._loop

    # The worker thread.

    def _work(self) -> None:
        use_device(self.device)
        while True:
            with self._cond:
                while not (self._inbox or self._stopping or self._unfinished()):
                    self._cond.wait()
                if self._stopping and not self._inbox and not self._unfinished():
                    return
                inbox, self._inbox = self._inbox, _Inbox()
            self._admit(inbox.adds)
            self._abort(inbox.aborts)
            self._run_jobs(inbox.jobs)
            if self._unfinished():
                self._step()

    def _unfinished(self) -> bool:
        return self.engine is not None and self.engine.has_unfinished()

    def _admit(self, adds: list[tuple[Sequence, RequestStream, asyncio.Future]]) -> None:
        assert self.engine is not None or not adds, "submit refuses requests without an engine"
        for seq, stream, admitted in adds:
            try:
                self.engine.add_request(seq)
            except Exception as err:  # QueueFullError, InvalidRequestError: the handler's call
                self._call_soon(_fail, admitted, err)
                continue
            self._ledger.admitted(seq, stream)
            self._call_soon(_resolve, admitted, stream)

    def _abort(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            if seq_id in self._ledger and self.engine.abort(seq_id):
                stream = self._ledger.aborted(seq_id)
                self._call_soon(stream.put, Delta([], FinishReason.ABORT))

    def _run_jobs(self, jobs: list[tuple[Callable[[], Any], asyncio.Future, int]]) -> None:
        for fn, future, batch_size in jobs:
            start = self._clock()
            try:
                result = fn()
            except Exception as err:
                self._call_soon(_fail, future, err)
            else:
                self._call_soon(_resolve, future, result)
            self.metrics.step(
                batch_size=batch_size,
                prefill_tokens=0,
                prefix_hit_tokens=0,
                preemptions=0,
                start=start,
                end=self._clock(),
            )

    def _step(self) -> None:
        start = self._clock()
        try:
            outputs = self.engine.step(start)
        except Exception:
            log.exception("engine step failed; failing the requests in flight")
            self._fail_all()
            return
        end = self._clock()
        stats = self.engine.stats
        self.metrics.step(
            batch_size=stats.batch_size,
            prefill_tokens=stats.prefill_tokens,
            prefix_hit_tokens=stats.prefix_cache_hit_tokens,
            preemptions=stats.preemptions,
            start=start,
            end=end,
        )
        self._ledger.after_step(end)
        deliveries = []
        for out in outputs:
            stream = self._ledger.output(out, end)
            if stream is not None:
                deliveries.append((stream, Delta(list(out.new_token_ids), out.finish_reason)))
        if deliveries:
            self._call_soon(_deliver, deliveries)

    def _fail_all(self) -> None:
        """After a failed step nothing in flight can be trusted: end every request with an error."""
        for seq_id, stream in self._ledger.fail_all():
            try:
                self.engine.abort(seq_id)
            except Exception:
                log.exception("could not abort sequence %d after a failed step", seq_id)
            self._call_soon(stream.put, Delta([], error="the model step failed"))

    def _call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self._require_loop().call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed under us: nobody is left to tell
            log.debug("event loop closed; dropped %s", getattr(fn, "__name__", fn))


# Run on the event loop.


def _resolve(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Any], err: BaseException) -> None:
    if not future.done():
        future.set_exception(err)


def _deliver(deliveries: list[tuple[RequestStream, Delta]]) -> None:
    for stream, delta in deliveries:
        stream.put(delta)
