"""The dynamic batcher: the pure policy exhaustively, then the asyncio driver's behaviour."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batching_engine.dynamic_batcher import (
    BatchPolicy,
    Dispatch,
    DynamicBatcher,
    Pending,
    Wait,
    admits,
    expired,
    next_batch,
)
from batching_engine.errors import QueueFullError, QueueTimeoutError
from infergrid.errors import ContractError

pytestmark = pytest.mark.timeout(60)

# The policy, case by case.


def test_an_empty_queue_waits_for_an_arrival() -> None:
    assert next_batch([], BatchPolicy(), now=5.0) == Wait(None)


def test_a_full_batch_goes_out_at_once() -> None:
    queue = [Pending(arrival=1.0)] * 5
    policy = BatchPolicy(max_batch_size=4, max_queue_delay_s=10)
    assert next_batch(queue, policy, now=1.0) == Dispatch((0, 1, 2, 3))


def test_the_largest_preferred_size_that_can_be_formed_goes_out_at_once() -> None:
    queue = [Pending(arrival=1.0)] * 7
    policy = BatchPolicy(max_batch_size=16, preferred_batch_sizes=(2, 4, 8), max_queue_delay_s=10)
    assert next_batch(queue, policy, now=1.0) == Dispatch((0, 1, 2, 3))


def test_a_short_queue_waits_until_its_oldest_request_has_waited_the_delay() -> None:
    queue = [Pending(arrival=2.0), Pending(arrival=1.0)]
    policy = BatchPolicy(max_batch_size=8, max_queue_delay_s=0.5)
    assert next_batch(queue, policy, now=1.2) == Wait(1.5)
    assert next_batch(queue, policy, now=1.5) == Dispatch((1, 0))


def test_a_waiting_queue_wakes_up_for_the_first_timeout() -> None:
    queue = [Pending(arrival=1.0, deadline=1.1)]
    assert next_batch(queue, BatchPolicy(max_queue_delay_s=0.5), now=1.0) == Wait(1.1)


def test_zero_delay_sends_whatever_is_queued() -> None:
    queue = [Pending(arrival=1.0)]
    assert next_batch(queue, BatchPolicy(max_queue_delay_s=0), now=1.0) == Dispatch((0,))


def test_higher_priority_requests_go_first_then_older_ones() -> None:
    queue = [Pending(1.0, priority=1), Pending(2.0, priority=0), Pending(1.5, priority=0)]
    policy = BatchPolicy(max_batch_size=2, max_queue_delay_s=10)
    assert next_batch(queue, policy, now=2.0) == Dispatch((2, 1))


def test_expired_requests_are_never_sent_and_are_reported() -> None:
    queue = [Pending(1.0, deadline=2.0), Pending(1.0)]
    policy = BatchPolicy(max_batch_size=1, max_queue_delay_s=10)
    assert expired(queue, now=2.0) == (0,)
    assert next_batch(queue, policy, now=2.0) == Dispatch((1,))


def test_admission_stops_at_the_queue_size() -> None:
    policy = BatchPolicy(max_queue_size=4)
    assert admits(2, 2, policy) and not admits(3, 2, policy)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_batch_size": 0}, "maxBatchSize"),
        ({"max_batch_size": 4, "preferred_batch_sizes": (8,)}, "preferredBatchSizes"),
        ({"max_queue_delay_s": -1}, "maxQueueDelayMs"),
        ({"max_queue_size": 0}, "maxQueueSize"),
    ],
)
def test_a_bad_policy_names_its_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ContractError) as err:
        BatchPolicy(**kwargs)
    assert err.value.field == field


# The policy, for any queue.

policies = st.builds(
    lambda max_size, preferred, delay, timeout: BatchPolicy(
        max_batch_size=max_size,
        preferred_batch_sizes=tuple(p for p in preferred if p <= max_size),
        max_queue_delay_s=delay,
        queue_timeout_s=timeout,
    ),
    st.integers(1, 8),
    st.lists(st.integers(1, 8), max_size=3),
    st.sampled_from([0.0, 0.5, 2.0]),
    st.none() | st.sampled_from([0.5, 3.0]),
)
pendings = st.builds(
    Pending,
    arrival=st.sampled_from([0.0, 1.0, 1.5, 2.0]),
    priority=st.integers(0, 2),
    deadline=st.none() | st.sampled_from([1.0, 2.0, 2.5, 4.0]),
)
queues = st.lists(pendings, max_size=12)
nows = st.sampled_from([2.0, 2.5, 3.0])


def order(p: Pending, i: int) -> tuple[int, float, int]:
    return (p.priority, p.arrival, i)


@settings(max_examples=2000, deadline=None)
@given(queue=queues, policy=policies, now=nows)
def test_any_decision_obeys_the_policy(queue: list[Pending], policy: BatchPolicy, now: float):
    gone = set(expired(queue, now))
    live = [i for i in range(len(queue)) if i not in gone]
    decision = next_batch(queue, policy, now)
    if isinstance(decision, Dispatch):
        batch = decision.indices
        assert 1 <= len(batch) <= policy.max_batch_size
        assert len(set(batch)) == len(batch) and not gone & set(batch)
        # Served in priority-then-arrival order, and nobody left behind outranks the batch.
        assert list(batch) == sorted(batch, key=lambda i: order(queue[i], i))
        left = [i for i in live if i not in batch]
        assert all(order(queue[j], j) > order(queue[i], i) for j in left for i in batch)
        # Either a target size, or the oldest has waited its delay and all live ones go.
        oldest = min(queue[i].arrival for i in live)
        waited = now >= oldest + policy.max_queue_delay_s
        assert len(batch) in policy.target_sizes or (waited and len(batch) == len(live))
    else:
        if not live:
            assert decision.until is None
            return
        # Waiting only while no target size can be formed and the delay has not run out.
        assert all(size > len(live) for size in policy.target_sizes)
        assert decision.until is not None and now < decision.until
        oldest = min(queue[i].arrival for i in live)
        assert decision.until <= oldest + policy.max_queue_delay_s
        # At the time it names, the batcher makes progress: a dispatch or an expiry.
        later = next_batch(queue, policy, decision.until)
        assert isinstance(later, Dispatch) or len(expired(queue, decision.until)) > len(gone)


# The driver: real asyncio, a fake model.


class FakeModel:
    """Doubles each input and records the batches it was given; `gate` can hold it."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def run(self, items: list[int]) -> list[int]:
        self.batches.append(items)
        await self.gate.wait()
        return [2 * x for x in items]


def run(coro) -> object:
    return asyncio.run(coro)


async def held_batcher(
    policy: BatchPolicy, first: list[int]
) -> tuple[FakeModel, DynamicBatcher, asyncio.Task]:
    """A started batcher whose model is held (its gate closed) by `first`, already running:
    whatever is submitted next waits in the queue."""
    model = FakeModel()
    model.gate.clear()
    batcher = DynamicBatcher(policy, model.run)
    batcher.start()
    running = asyncio.create_task(batcher.submit(first))
    while not model.batches:
        await asyncio.sleep(0)
    return model, batcher, running


def test_concurrent_requests_share_a_batch_and_get_their_own_results() -> None:
    async def scenario() -> tuple[list, list]:
        model = FakeModel()
        batcher = DynamicBatcher(BatchPolicy(max_batch_size=3, max_queue_delay_s=60), model.run)
        batcher.start()
        results = await asyncio.gather(*(batcher.submit([x]) for x in (1, 2, 3)))
        await batcher.close()
        return results, model.batches

    results, batches = run(scenario())
    assert results == [[2], [4], [6]] and batches == [[1, 2, 3]]


def test_a_lone_request_goes_out_after_the_delay() -> None:
    async def scenario() -> tuple[list, list]:
        model = FakeModel()
        batcher = DynamicBatcher(BatchPolicy(max_batch_size=8, max_queue_delay_s=0.01), model.run)
        batcher.start()
        result = await batcher.submit([5, 6])
        await batcher.close()
        return result, model.batches

    assert run(scenario()) == ([10, 12], [[5, 6]])


def test_a_full_queue_rejects_at_once() -> None:
    async def scenario() -> None:
        policy = BatchPolicy(max_batch_size=1, max_queue_size=2)
        model, batcher, first = await held_batcher(policy, [1])
        queued = asyncio.create_task(batcher.submit([2, 3]))
        await asyncio.sleep(0)
        with pytest.raises(QueueFullError):
            await batcher.submit([4])
        model.gate.set()
        assert await first == [2] and await queued == [4, 6]
        await batcher.close()

    run(scenario())


def test_a_request_that_waits_past_its_timeout_is_dropped() -> None:
    async def scenario() -> list:
        model, batcher, first = await held_batcher(BatchPolicy(max_batch_size=1), [1])
        with pytest.raises(QueueTimeoutError):
            await batcher.submit([2], timeout_s=0.01)
        model.gate.set()
        assert await first == [2]
        await batcher.close()
        return model.batches

    assert run(scenario()) == [[1]]


def test_higher_priority_waiting_requests_run_first() -> None:
    async def scenario() -> list:
        model, batcher, first = await held_batcher(BatchPolicy(max_batch_size=1), [0])
        low = asyncio.create_task(batcher.submit([1], priority=5))
        high = asyncio.create_task(batcher.submit([2], priority=0))
        await asyncio.sleep(0)
        model.gate.set()
        await asyncio.gather(first, low, high)
        await batcher.close()
        return model.batches

    assert run(scenario()) == [[0], [2], [1]]


def test_a_cancelled_request_leaves_the_queue_without_running() -> None:
    async def scenario() -> list:
        model, batcher, first = await held_batcher(BatchPolicy(max_batch_size=1), [1])
        gone = asyncio.create_task(batcher.submit([2]))
        await asyncio.sleep(0)  # queued behind the first
        gone.cancel()
        await asyncio.sleep(0)
        model.gate.set()
        await first
        await batcher.close()
        return model.batches

    assert run(scenario()) == [[1]]


def test_a_failing_batch_fails_its_requests_and_the_batcher_goes_on() -> None:
    async def scenario() -> list:
        calls = 0

        async def flaky(items: list[int]) -> list[int]:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("device fell over")
            return items

        batcher = DynamicBatcher(BatchPolicy(max_queue_delay_s=0), flaky)
        batcher.start()
        with pytest.raises(RuntimeError):
            await batcher.submit([1])
        result = await batcher.submit([2])
        await batcher.close()
        return result

    assert run(scenario()) == [2]


def test_closing_rejects_new_requests_and_finishes_queued_ones() -> None:
    async def scenario() -> None:
        model = FakeModel()
        batcher = DynamicBatcher(BatchPolicy(max_batch_size=4, max_queue_delay_s=60), model.run)
        batcher.start()
        queued = asyncio.create_task(batcher.submit([7]))
        await asyncio.sleep(0)
        closing = asyncio.create_task(batcher.close())
        await asyncio.sleep(0)
        with pytest.raises(QueueFullError):
            await batcher.submit([8])
        assert await queued == [14]
        await closing

    run(scenario())
