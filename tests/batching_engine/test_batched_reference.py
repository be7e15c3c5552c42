"""Under continuous batching every request decodes what it would decode alone.

The engine (scheduler, block manager, runner) serves many requests at once: prompts split
over steps, decodes mixed with prefills, requests preempted and recomputed when the cache is
short, prefixes shared through the prefix cache. None of it may change a single greedy token:
each request's output must equal transformers' `generate` run on that request alone.
"""

from __future__ import annotations

import math

import pytest
import torch

from batching_engine.config import EngineConfig
from batching_engine.engine import LLMEngine
from batching_engine.model_runner import ModelRunner
from batching_engine.sequence import SamplingParams, Sequence
from harness.tiny_llama import LLAMA3_ROPE, hf_greedy, save_tiny_llama

BLOCK_BYTES = 8192  # one 16-token block of the tiny model: 2 layers x (K, V) x 16 x 2 x 16 x 4 B


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    return path, save_tiny_llama(path, rope_scaling=LLAMA3_ROPE)


def requests(lengths: list[int], max_tokens: list[int], seed: int = 3) -> list[Sequence]:
    generator = torch.Generator().manual_seed(seed)
    return [
        Sequence(
            torch.randint(0, 256, (n,), generator=generator).tolist(),
            SamplingParams(temperature=0.0, max_tokens=m),
            queue_timeout_s=math.inf,
        )
        for n, m in zip(lengths, max_tokens, strict=True)
    ]


def serve(engine: LLMEngine, seqs: list[Sequence]) -> int:
    """Add all, step until done; returns how many steps ran."""
    for seq in seqs:
        engine.add_request(seq)
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    return steps


def engine_for(model_dir, num_blocks: int, **config) -> LLMEngine:
    config = EngineConfig(**config)
    runner = ModelRunner(
        model_dir,
        block_size=config.block_size,
        kv_cache_memory_bytes=num_blocks * BLOCK_BYTES,
        max_model_len=config.max_model_len,
    )
    return LLMEngine(config, runner, eos_token_ids=())


def test_sixteen_concurrent_requests_with_chunked_prefill_match_transformers_alone(tiny):
    path, reference = tiny
    lengths = [1, 70, 5, 33, 12, 48, 2, 64, 9, 21, 40, 3, 17, 55, 8, 27]
    seqs = requests(lengths, [4 + i % 9 for i in range(16)])
    # 32 tokens a step: prompts of 33 to 70 tokens are split over steps, beside decodes.
    engine = engine_for(
        path,
        128,
        max_num_seqs=16,
        max_num_batched_tokens=32,
        max_model_len=128,
        enable_prefix_caching=False,
    )
    serve(engine, seqs)
    for seq in seqs:
        assert seq.output_token_ids == hf_greedy(
            reference, seq.prompt_token_ids, seq.params.max_tokens
        )


def test_requests_preempted_for_a_tiny_cache_recompute_the_same_tokens(tiny):
    path, reference = tiny
    seqs = requests([20, 22, 18, 25, 21, 19], [30] * 6)
    # Each request grows to 4 blocks; 6 blocks hold one and a half of them.
    engine = engine_for(
        path,
        6,
        max_num_seqs=6,
        max_num_batched_tokens=64,
        max_model_len=64,
        enable_prefix_caching=False,
    )
    serve(engine, seqs)
    assert sum(seq.num_preemptions for seq in seqs) > 0
    for seq in seqs:
        assert seq.output_token_ids == hf_greedy(reference, seq.prompt_token_ids, 30)


def test_requests_sharing_a_cached_prefix_compute_only_their_suffix_and_match(tiny):
    path, reference = tiny
    [shared] = requests([40], [1])
    suffixes = requests([8, 3, 16], [1, 1, 1], seed=4)
    seqs = [
        Sequence(
            shared.prompt_token_ids + s.prompt_token_ids,
            SamplingParams(temperature=0.0, max_tokens=10),
            queue_timeout_s=math.inf,
        )
        for s in suffixes
    ]
    engine = engine_for(
        path,
        64,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=128,
        enable_prefix_caching=True,
    )
    serve(engine, seqs[:1])
    serve(engine, seqs[1:])
    assert [seq.num_cached_tokens for seq in seqs] == [0, 32, 32]  # two full blocks of 16
    for seq in seqs:
        assert seq.output_token_ids == hf_greedy(reference, seq.prompt_token_ids, 10)


def sampled(seqs: list[Sequence], seed: int) -> list[Sequence]:
    """Fresh copies of `seqs` that sample (temperature, top-p) with their own seeds."""
    return [
        Sequence(
            list(seq.prompt_token_ids),
            SamplingParams(temperature=0.8, top_p=0.9, max_tokens=16, seed=seed + i),
            queue_timeout_s=math.inf,
        )
        for i, seq in enumerate(seqs)
    ]


def test_seeded_sampling_repeats_whatever_the_batch_and_through_preemption(tiny):
    path, _ = tiny
    prompts = requests([20, 22, 18, 25], [1] * 4)
    roomy = engine_for(path, 64, max_num_seqs=1, max_num_batched_tokens=64, max_model_len=64)
    alone = sampled(prompts, seed=100)
    for seq in alone:  # one at a time: max_num_seqs=1
        serve(roomy, [seq])
    # All at once in a cache of five blocks: they share steps and preempt one another.
    crowded = sampled(prompts, seed=100)
    tight = engine_for(path, 5, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                       enable_prefix_caching=False)  # fmt: skip
    serve(tight, crowded)
    assert sum(seq.num_preemptions for seq in crowded) > 0
    assert [seq.output_token_ids for seq in crowded] == [seq.output_token_ids for seq in alone]
    assert len({tuple(seq.output_token_ids) for seq in alone}) == 4
