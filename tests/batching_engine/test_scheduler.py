"""Continuous batching: budgets hold every step, nothing admitted is lost, priorities rule.

`step` below plays the engine's part around the scheduler: it marks each chunk computed,
appends a token when a chunk reaches the end of its sequence, and finishes sequences at
max_tokens. The scheduler itself reads no clock; each test passes `now`.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batching_engine.block_manager import BlockManager
from batching_engine.config import EngineConfig
from batching_engine.errors import InvalidRequestError, QueueFullError, RequestTooLongError
from batching_engine.scheduler import ScheduledBatch, Scheduler
from batching_engine.sequence import FinishReason, SamplingParams, Sequence, SequenceStatus

BS = 8


def make(num_blocks: int = 64, caching: bool = False, **config: object) -> Scheduler:
    settings_ = {"block_size": BS, "max_num_seqs": 4, "max_num_batched_tokens": 64,
                 "max_model_len": 128, "queue_timeout_s": 86400.0, **config}  # fmt: skip
    cfg = EngineConfig(**settings_)  # type: ignore[arg-type]
    return Scheduler(cfg, BlockManager(num_blocks, BS, caching))


def request(
    prompt_len: int, max_tokens: int = 4, priority: int = 0, arrival: float = 0.0, first: int = 0
) -> Sequence:
    prompt = [(first + i) % 5 for i in range(prompt_len)]
    return Sequence(prompt, SamplingParams(max_tokens=max_tokens), priority, arrival)


def step(sched: Scheduler, now: float = 0.0) -> ScheduledBatch:
    batch = sched.schedule(now)
    postprocess(sched, batch)
    return batch


def postprocess(sched: Scheduler, batch: ScheduledBatch) -> None:
    for seq, n in batch.scheduled:
        ends = seq.num_computed_tokens + n == seq.num_tokens
        sched.mark_computed(seq, n)
        if ends:
            seq.output_token_ids.append(seq.num_tokens % 5)
            done = len(seq.output_token_ids) >= seq.params.max_tokens
            if done or seq.num_tokens >= sched.config.max_model_len:
                sched.finish(seq, FinishReason.LENGTH)


def check_batch(sched: Scheduler, batch: ScheduledBatch) -> None:
    cfg, seen = sched.config, set()
    assert len(batch.scheduled) <= cfg.max_num_seqs
    assert sum(n for _, n in batch.scheduled) <= cfg.max_num_batched_tokens
    assert sched.num_running <= cfg.max_num_seqs
    for seq, n in batch.scheduled:
        assert seq.seq_id not in seen and seq.status is SequenceStatus.RUNNING
        seen.add(seq.seq_id)
        assert 1 <= n <= seq.num_uncomputed_tokens
        assert len(seq.block_table) * BS >= seq.num_computed_tokens + n  # slots exist
    for seq in sched.waiting:
        assert seq.block_table == [] and seq.num_computed_tokens == 0


workloads = st.lists(
    st.tuples(st.integers(0, 8), st.integers(1, 60), st.integers(1, 24), st.integers(0, 1)),
    min_size=1, max_size=14,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    workload=workloads,
    max_num_seqs=st.integers(1, 5),
    budget=st.integers(16, 48),
    num_blocks=st.integers(2, 24),
    caching=st.booleans(),
)
def test_budgets_hold_and_every_admitted_sequence_finishes(
    workload, max_num_seqs, budget, num_blocks, caching
):
    sched = make(num_blocks, caching, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                 max_model_len=64)  # fmt: skip
    accepted: list[Sequence] = []
    for now in range(3000):
        for arrive, prompt_len, max_tokens, priority in workload:
            if arrive == now:
                seq = request(prompt_len, max_tokens, priority, float(now), first=priority)
                try:
                    sched.add(seq)
                    accepted.append(seq)
                except RequestTooLongError:
                    last = min(prompt_len + max_tokens, 64) - 1
                    assert prompt_len >= 64 or sched.block_manager.blocks_for(last) > num_blocks
        if now > 8 and not sched.has_unfinished():
            break
        batch = sched.schedule(float(now))
        check_batch(sched, batch)
        postprocess(sched, batch)
    assert not sched.has_unfinished()
    for seq in accepted:
        assert seq.finish_reason is FinishReason.LENGTH and seq.block_table == []
        expected = min(seq.params.max_tokens, 64 - seq.num_prompt_tokens)
        assert len(seq.output_token_ids) == expected
    assert sched.block_manager.num_free_blocks == num_blocks


def test_running_decodes_go_before_prefills_and_long_prompts_are_chunked():
    sched = make(max_num_batched_tokens=16)
    short = request(4, max_tokens=10)
    sched.add(short)
    step(sched)
    long = request(40, arrival=1.0)
    sched.add(long)
    chunks = [dict((s.seq_id, n) for s, n in step(sched).scheduled) for _ in range(3)]
    assert [c[short.seq_id] for c in chunks] == [1, 1, 1]
    assert [c[long.seq_id] for c in chunks] == [15, 15, 10]
    assert len(long.output_token_ids) == 1  # sampled only when the last chunk ran


def test_lower_priority_number_is_admitted_first():
    sched = make(max_num_seqs=1)
    background = request(4, priority=1, arrival=0.0)
    urgent = request(4, priority=0, arrival=5.0)
    sched.add(background)
    sched.add(urgent)
    assert [s for s, _ in step(sched, 6.0).scheduled] == [urgent]


def test_out_of_range_priority_is_refused():
    with pytest.raises(InvalidRequestError, match=r"^priority: must be from 0 to 1, got 2"):
        make().add(request(4, priority=2))


def preempting_pair(caching: bool = False) -> tuple[Scheduler, Sequence, Sequence]:
    """Two sequences in a 4-block cache, each of which will need a third block."""
    sched = make(num_blocks=4, caching=caching)
    old, new = request(16, max_tokens=8), request(15, max_tokens=8, arrival=1.0, first=2)
    sched.add(old)
    sched.add(new)
    return sched, old, new


def test_when_blocks_run_out_the_newest_is_preempted_and_resumes_with_its_output():
    sched, old, new = preempting_pair()
    step(sched, 1.0)  # both prefill; old now has 17 tokens and needs a third block
    batch = step(sched, 2.0)
    assert batch.num_preemptions == 1 and [s for s, _ in batch.scheduled] == [old]
    assert new.status is SequenceStatus.WAITING and sched.waiting[0] is new
    assert new.num_preemptions == 1 and new.num_computed_tokens == 0
    assert new.output_token_ids == [0]  # kept: recompute prefills prompt and output
    while new.status is not SequenceStatus.RUNNING:
        resumed = step(sched, 3.0)
    assert old.is_finished
    assert resumed.scheduled == [(new, 16)]  # prompt and output, then it samples again
    assert new.output_token_ids == [0, 1]
    while sched.has_unfinished():
        step(sched, 5.0)
    assert len(new.output_token_ids) == 8


def test_lower_priority_running_sequence_is_preempted_even_if_older():
    sched = make(num_blocks=4)
    background = request(16, max_tokens=8, priority=1, arrival=0.0)
    urgent = request(15, max_tokens=8, priority=0, arrival=1.0, first=2)
    sched.add(background)
    sched.add(urgent)
    step(sched, 1.0)
    step(sched, 2.0)
    assert background.num_preemptions == 1 and urgent.num_preemptions == 0


def test_preempted_sequence_goes_ahead_of_later_arrivals_of_its_class():
    sched, old, new = preempting_pair()
    step(sched, 1.0)
    late = request(4, arrival=1.5)
    sched.add(late)
    step(sched, 2.0)
    assert sched.waiting == [new, late]


def test_a_waiting_sequence_times_out_but_a_preempted_one_does_not():
    sched, old, new = preempting_pair()
    step(sched, 1.0)
    step(sched, 2.0)  # new is preempted
    patient = request(4, arrival=2.0)
    impatient = request(4, arrival=2.0)
    impatient.queue_timeout_s = 5.0
    sched.add(patient)
    sched.add(impatient)
    batch = sched.schedule(10.0)
    assert batch.timed_out == [impatient] and impatient.finish_reason is FinishReason.TIMEOUT
    assert sched.waiting[:2] == [new, patient]
    expired = sched.schedule(86400.0 + 3.0)
    assert expired.timed_out == [patient] and new.status is not SequenceStatus.FINISHED


def test_full_queue_refuses_and_keeps_what_it_has():
    sched = make(max_queue_size=2)
    first, second = request(4), request(4)
    sched.add(first)
    sched.add(second)
    with pytest.raises(QueueFullError):
        sched.add(request(4))
    assert sched.waiting == [first, second]


@pytest.mark.parametrize(
    ("prompt_len", "max_tokens", "num_blocks", "message"),
    [
        (128, 1, 64, r"^prompt: must hold 1 to 127 tokens .* got 128"),
        (0, 1, 64, r"^prompt: must hold 1 to 127 tokens"),
        (40, 1, 4, r"^prompt: 40 tokens exceed the KV cache's 32"),
        (30, 10, 4, r"^max_tokens: prompt plus max_tokens is 40 tokens; .* at most 3 fit"),
    ],
)
def test_requests_that_can_never_run_are_refused_with_the_field(
    prompt_len, max_tokens, num_blocks, message
):
    sched = make(num_blocks=num_blocks)
    with pytest.raises(RequestTooLongError, match=message):
        sched.add(request(prompt_len, max_tokens))
    assert not sched.has_unfinished()


def test_max_tokens_that_fit_exactly_are_served():
    sched = make(num_blocks=4)
    seq = request(30, max_tokens=3)  # 32 tokens: KV for 31 of them fits 4 blocks
    sched.add(seq)
    while sched.has_unfinished():
        step(sched)
    assert len(seq.output_token_ids) == 3


def test_abort_frees_blocks_of_running_and_removes_waiting():
    sched = make(num_blocks=8, max_num_seqs=1)
    running, waiting = request(20), request(4, arrival=1.0)
    sched.add(running)
    sched.add(waiting)
    step(sched)
    assert sched.abort(running.seq_id) is running and sched.abort(waiting.seq_id) is waiting
    assert running.finish_reason is waiting.finish_reason is FinishReason.ABORT
    assert sched.block_manager.num_free_blocks == 8 and not sched.has_unfinished()
    assert sched.abort(running.seq_id) is None


def test_prefix_cache_hits_are_not_computed_again():
    sched = make(caching=True)
    first = request(20)
    sched.add(first)
    step(sched)
    second = request(20, arrival=1.0)
    sched.add(second)
    batch = step(sched)
    assert (second, 4) in batch.scheduled and batch.num_cached_tokens == 16
