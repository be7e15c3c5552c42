"""The generation loop end to end, against a runner that reads its answers from the KV cache.

`KVRunner` is the neighbour across the seam. The KV it stores at a position is a hash of
the KV one position earlier and the token there, read back through the block table; the
next token comes from the last position's KV. So any mistake in blocks, prefix hits,
chunking or recompute changes the tokens, and every configuration must produce exactly
what `reference` computes from the token ids alone.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batching_engine.config import EngineConfig
from batching_engine.engine import LLMEngine, StepOutput
from batching_engine.errors import InvalidRequestError
from batching_engine.sequence import FinishReason, SamplingParams, Sequence

VOCAB = 40
EOS = 39


def kv_of(previous: int, token: int) -> int:
    return hash((previous, token)) & 0xFFFF_FFFF


class KVRunner:
    """Context KV is read as it stood before the step, the way a batched forward pass sees it:
    a sequence may only read positions some earlier step computed.
    """

    kv_cache_commits_lazily = False
    device = torch.device("cpu")  # a CPU step budget where the config leaves it

    def __init__(self, num_kv_blocks: int, block_size: int) -> None:
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.kv: dict[int, int] = {}

    def slot(self, seq: Sequence, position: int) -> int:
        block = seq.block_table[position // self.block_size]
        return block * self.block_size + position % self.block_size

    def execute(self, batch: list[tuple[Sequence, int]]) -> list[int | None]:
        before, out = dict(self.kv), []
        for seq, n in batch:
            token_ids, start = seq.token_ids, seq.num_computed_tokens
            kv = before[self.slot(seq, start - 1)] if start else 0
            for p in range(start, start + n):
                kv = kv_of(kv, token_ids[p])
                self.kv[self.slot(seq, p)] = kv
            out.append(kv % VOCAB if start + n == len(token_ids) else None)
        return out


def reference(prompt: list[int], max_tokens: int, max_model_len: int = 2048) -> list[int]:
    """Greedy continuation from token ids alone, stopping at EOS or a length limit."""
    kv, output = 0, []
    for token in prompt:
        kv = kv_of(kv, token)
    while len(output) < max_tokens and len(prompt) + len(output) < max_model_len:
        output.append(kv % VOCAB)
        if output[-1] == EOS:
            break
        kv = kv_of(kv, output[-1])
    return output


def detokenize(ids: list[int]) -> str:
    return "".join(chr(ord("a") + t % 26) for t in ids)


class Letters:
    """`detokenize` a token at a time: the engine's output text stream in these tests."""

    def __init__(self) -> None:
        self.text = ""

    def push(self, token_id: int) -> str:
        piece = detokenize([token_id])
        self.text += piece
        return piece


def engine(num_kv_blocks: int = 256, **config: object) -> LLMEngine:
    cfg = EngineConfig(**{"block_size": 8, "max_model_len": 256, **config})  # type: ignore[arg-type]
    return LLMEngine(cfg, KVRunner(num_kv_blocks, cfg.block_size), [EOS], Letters)


def drive(eng: LLMEngine, seqs: list[Sequence]) -> tuple[list[StepOutput], dict[str, int]]:
    """Run to the end; every step's outputs, and the step counters summed."""
    for seq in seqs:
        eng.add_request(seq)
    outputs, totals = [], dict.fromkeys(("prefill", "decode", "hits", "preemptions"), 0)
    while eng.has_unfinished():
        outputs += eng.step()
        s = eng.stats
        assert s.batch_size <= eng.config.max_num_seqs and 0.0 <= s.kv_usage <= 1.0
        for key, value in zip(totals, (s.prefill_tokens, s.decode_tokens,
                                       s.prefix_cache_hit_tokens, s.preemptions),
                              strict=True):  # fmt: skip
            totals[key] += value
    return outputs, totals


def prompts(count: int, length: int, shared: int) -> list[list[int]]:
    return [[i % 7 for i in range(shared)] + [(i * k + 3) % 11 for i in range(length - shared)]
            for k in range(count)]  # fmt: skip


def requests(count: int = 6, length: int = 30, shared: int = 16, max_tokens: int = 20):
    return [(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            for p in prompts(count, length, shared)]  # fmt: skip


def expected(reqs) -> list[list[int]]:
    return [reference(p, params.max_tokens) if not params.ignore_eos else _no_eos(p, params)
            for p, params in reqs]  # fmt: skip


def _no_eos(prompt: list[int], params: SamplingParams) -> list[int]:
    kv, output = 0, []
    for token in prompt:
        kv = kv_of(kv, token)
    for _ in range(params.max_tokens):
        output.append(kv % VOCAB)
        kv = kv_of(kv, output[-1])
    return output


def test_generate_matches_the_reference():
    reqs = requests()
    assert engine().generate(reqs) == expected(reqs)


def test_preemption_does_not_change_outputs():
    reqs = requests(count=6, length=30, shared=0, max_tokens=30)
    seqs = [Sequence(p, params) for p, params in reqs]
    _, totals = drive(engine(num_kv_blocks=16, enable_prefix_caching=False), seqs)
    assert totals["preemptions"] > 0
    assert [s.output_token_ids for s in seqs] == expected(reqs)


def test_chunked_prefill_does_not_change_outputs():
    reqs = requests(count=3, length=100)
    seqs = [Sequence(p, params) for p, params in reqs]
    _, totals = drive(engine(max_num_seqs=4, max_num_batched_tokens=16), seqs)
    assert [s.output_token_ids for s in seqs] == expected(reqs)
    assert totals["decode"] > 0


@pytest.mark.parametrize("caching", [True, False])
def test_prefix_caching_does_not_change_outputs(caching):
    reqs = requests(count=6, length=40, shared=32)
    seqs = [Sequence(p, params) for p, params in reqs]
    _, totals = drive(engine(max_num_seqs=1, enable_prefix_caching=caching), seqs)
    assert [s.output_token_ids for s in seqs] == expected(reqs)
    assert (totals["hits"] > 0) is caching
    assert totals["prefill"] == 6 * 40 - totals["hits"]


PIECES = [[1] * 8, [2] * 8, [1, 2] * 4]
prompt_strategy = (
    st.tuples(
        st.lists(st.sampled_from(PIECES), max_size=5), st.lists(st.integers(0, 3), max_size=12)
    )
    .map(lambda p: [t for piece in p[0] for t in piece] + p[1])
    .filter(bool)
)


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(st.tuples(prompt_strategy, st.integers(1, 30)), min_size=1, max_size=8),
    num_kv_blocks=st.integers(12, 40),
    max_num_seqs=st.integers(1, 6),
    budget=st.integers(16, 64),
    caching=st.booleans(),
)  # fmt: skip
def test_any_batching_gives_the_reference_tokens(
    shapes, num_kv_blocks, max_num_seqs, budget, caching
):
    """Prompts are built from a few repeated blocks, so equal blocks follow unequal prefixes."""
    reqs = [(prompt, SamplingParams(max_tokens=m)) for prompt, m in shapes]
    eng = engine(num_kv_blocks, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                 max_model_len=64, enable_prefix_caching=caching)  # fmt: skip
    fits = [eng.block_manager.blocks_for(min(len(p) + params.max_tokens, 64) - 1) <= num_kv_blocks
            for p, params in reqs]  # fmt: skip
    reqs = [r for r, ok in zip(reqs, fits, strict=True) if ok]
    assert eng.generate(reqs) == [reference(p, params.max_tokens, 64) for p, params in reqs]
    assert eng.block_manager.num_free_blocks == num_kv_blocks


def test_eos_finishes_with_stop_and_is_the_last_token():
    prompt = next(p for p in prompts(200, 12, 0) if EOS in reference(p, 100)[1:])
    seq = Sequence(prompt, SamplingParams(max_tokens=100))
    outputs, _ = drive(engine(), [seq])
    assert seq.output_token_ids == reference(prompt, 100) and seq.output_token_ids[-1] == EOS
    assert outputs[-1].finished and outputs[-1].finish_reason is FinishReason.STOP


def test_ignore_eos_runs_to_max_tokens():
    prompt = next(p for p in prompts(200, 12, 0) if EOS in reference(p, 100)[1:])
    seq = Sequence(prompt, SamplingParams(max_tokens=100, ignore_eos=True))
    drive(engine(), [seq])
    assert len(seq.output_token_ids) == 100 and seq.finish_reason is FinishReason.LENGTH


def test_max_tokens_and_max_model_len_finish_with_length():
    short, long = Sequence([1, 2, 3], SamplingParams(max_tokens=5)), Sequence(
        [1] * 20, SamplingParams(max_tokens=500, ignore_eos=True))  # fmt: skip
    drive(engine(max_model_len=32), [short, long])
    assert short.finish_reason is long.finish_reason is FinishReason.LENGTH
    assert len(short.output_token_ids) == min(5, len(reference([1, 2, 3], 5)))
    assert long.num_tokens == 32


def test_a_stop_string_finishes_and_marks_where_the_text_ends():
    prompt = [3, 1, 4, 1, 5]
    full = _no_eos(prompt, SamplingParams(max_tokens=30))
    text = detokenize(full)
    stop = text[10:13]
    at = text.find(stop)
    seq = Sequence(prompt, SamplingParams(max_tokens=30, stop=("zzzz", stop), ignore_eos=True))
    outputs, _ = drive(engine(), [seq])
    assert seq.finish_reason is FinishReason.STOP and seq.text_end == at
    assert detokenize(seq.output_token_ids)[: seq.text_end] == text[:at]
    assert len(seq.output_token_ids) == at + len(stop)  # one character per token here
    assert outputs[-1].finished


def test_stop_strings_need_a_detokenizer():
    eng = LLMEngine(EngineConfig(), KVRunner(64, 16), [EOS])
    with pytest.raises(InvalidRequestError, match=r"^stop: "):
        eng.add_request(Sequence([1], SamplingParams(stop=("x",))))
    assert not eng.has_unfinished()


def test_step_outputs_stream_each_token_once_and_finish_once():
    reqs = requests(count=3, max_tokens=7)
    seqs = [Sequence(p, params) for p, params in reqs]
    outputs, _ = drive(engine(max_num_batched_tokens=16, max_num_seqs=2), seqs)
    for seq in seqs:
        mine = [o for o in outputs if o.seq is seq]
        assert [t for o in mine for t in o.new_token_ids] == seq.output_token_ids
        assert [o.finished for o in mine] == [False] * 6 + [True]


def test_a_request_that_waits_too_long_is_reported_as_timed_out():
    eng = engine(max_num_seqs=1)
    busy = Sequence([1] * 10, SamplingParams(max_tokens=50, ignore_eos=True), arrival_time=0.0)
    late = Sequence([2] * 10, arrival_time=0.0, queue_timeout_s=1.0)
    eng.add_request(busy)
    eng.add_request(late)
    eng.step(now=0.5)
    outputs = eng.step(now=2.0)
    assert StepOutput(late, [], True, FinishReason.TIMEOUT) in outputs
    assert eng.stats.timeouts == 1 and eng.stats.num_waiting == 0


def test_abort_frees_the_cache():
    eng = engine(num_kv_blocks=32)
    seq = Sequence([1] * 30, SamplingParams(max_tokens=50))
    eng.add_request(seq)
    eng.step()
    assert eng.abort(seq.seq_id) and seq.finish_reason is FinishReason.ABORT
    assert eng.block_manager.num_free_blocks == 32 and not eng.has_unfinished()
    assert not eng.abort(seq.seq_id)


def test_a_runner_that_breaks_the_contract_is_caught():
    class Eager(KVRunner):
        def execute(self, batch):
            return [7 for _ in batch]  # samples even from a partial prefill chunk

    eng = LLMEngine(EngineConfig(max_num_batched_tokens=16, max_num_seqs=4, block_size=8),
                    Eager(64, 8), [EOS])  # fmt: skip
    eng.add_request(Sequence([1] * 40))
    with pytest.raises(RuntimeError, match="stops short"):
        eng.step()
