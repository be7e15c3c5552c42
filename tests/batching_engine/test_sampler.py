"""Each row of a batch is sampled by its own request's settings, and seeds reproduce."""

from __future__ import annotations

import torch

from batching_engine.sampler import sample
from batching_engine.sequence import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def logits_from(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs).log()


def random_logits(rows: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_rows_take_the_argmax_whatever_shares_the_batch():
    logits = random_logits(4)
    params = [GREEDY, SamplingParams(temperature=1.5), GREEDY, SamplingParams(top_k=5)]
    tokens = sample(logits, params, [0] * 4)
    assert tokens[0] == int(logits[0].argmax()) and tokens[2] == int(logits[2].argmax())


def test_a_seed_gives_the_same_token_whatever_else_is_in_the_batch():
    row = random_logits(1, seed=7)
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    alone = sample(row, [seeded], [5])
    for companions in (1, 3, 8):
        batch = torch.cat([random_logits(companions, seed=companions), row])
        others = [SamplingParams(temperature=0.7, seed=c) for c in range(companions)]
        assert sample(batch, [*others, seeded], [0] * companions + [5])[-1:] == alone


def test_a_seeded_request_draws_a_fresh_token_at_each_step():
    uniform = torch.zeros(1, 1000)
    seeded = SamplingParams(temperature=1.0, seed=42)
    draws = [sample(uniform, [seeded], [step])[0] for step in range(20)]
    assert len(set(draws)) > 15
    assert draws == [sample(uniform, [seeded], [step])[0] for step in range(20)]


def test_different_seeds_draw_different_streams():
    uniform = torch.zeros(1, 1000)
    streams = {
        tuple(sample(uniform, [SamplingParams(seed=seed)], [step])[0] for step in range(5))
        for seed in range(10)
    }
    assert len(streams) == 10


def test_top_k_keeps_only_the_k_most_likely_tokens():
    logits = random_logits(1, vocab=100, seed=3)
    top5 = set(logits[0].topk(5).indices.tolist())
    draws = {
        sample(logits, [SamplingParams(temperature=5.0, top_k=5, seed=s)], [0])[0]
        for s in range(200)
    }
    assert draws <= top5 and len(draws) > 1


def test_top_k_of_one_is_greedy_at_any_temperature():
    logits = random_logits(3, seed=5)
    params = [SamplingParams(temperature=9.0, top_k=1, seed=s) for s in range(3)]
    assert sample(logits, params, [0] * 3) == logits.argmax(dim=-1).tolist()


def test_top_p_keeps_the_smallest_set_whose_mass_reaches_p():
    logits = logits_from([0.5, 0.3, 0.15, 0.05])
    # Mass before each token: 0, 0.5, 0.8, 0.95 -> with p = 0.7 only tokens 0 and 1 remain.
    draws = {sample(logits[None], [SamplingParams(top_p=0.7, seed=s)], [0])[0] for s in range(300)}
    assert draws == {0, 1}


def test_temperature_sampling_follows_the_distribution():
    torch.manual_seed(0)
    probs = [0.6, 0.3, 0.1]
    rows = 4000
    tokens = sample(logits_from(probs).expand(rows, 3), [SamplingParams()] * rows, [0] * rows)
    frequencies = torch.bincount(torch.tensor(tokens), minlength=3) / rows
    assert torch.allclose(frequencies, torch.tensor(probs), atol=0.03)


def test_low_temperature_sharpens_towards_the_argmax():
    torch.manual_seed(0)
    rows = 2000
    logits = logits_from([0.4, 0.35, 0.25]).expand(rows, 3)
    tokens = sample(logits, [SamplingParams(temperature=0.1)] * rows, [0] * rows)
    assert tokens.count(0) / rows > 0.75
