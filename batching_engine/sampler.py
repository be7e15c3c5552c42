"""Pick the next token for every completing sequence of a batch, each with its own settings.

Greedy rows take the argmax. Other rows are scaled by their temperature, cut to their top-k
and top-p, and sampled with the exponential race: argmax(p / E) with E ~ Exp(1) picks token i
with probability p_i, and lets each row draw its noise from its own generator.

A seeded request draws from a generator seeded by (seed, step), where step is how many tokens
it has produced. So the same seed gives the same tokens whatever else shares the batch, and a
preempted request that is recomputed resumes the same stream, with no generator state to keep.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from batching_engine.sequence import SamplingParams
from batching_engine.staging import stage

_MASK64 = (1 << 64) - 1


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], steps: Sequence[int]
) -> list[int]:
    """One token per row of logits ([rows, vocab]); `steps[i]` is row i's output length so far."""
    tokens = logits.argmax(dim=-1)
    random_rows = [row for row, p in enumerate(params) if not p.greedy]
    if random_rows:
        chosen = [params[row] for row in random_rows]
        vocab = logits.shape[-1]
        settings = stage(
            {
                "index": torch.tensor(random_rows, dtype=torch.int64),
                "temperature": torch.tensor([p.temperature for p in chosen], dtype=torch.float32),
                "top_k": torch.tensor([p.top_k or vocab for p in chosen], dtype=torch.int64),
                "top_p": torch.tensor([p.top_p for p in chosen], dtype=torch.float32),
            },
            logits.device,
        )  # one non-blocking copy: the `.tolist()` below stays the only sync
        index = settings["index"]
        scaled = logits[index].float() / settings["temperature"][:, None]
        probs = _truncate(scaled, chosen, settings["top_k"], settings["top_p"]).softmax(dim=-1)
        noise = _exponential_noise(probs, chosen, [steps[row] for row in random_rows])
        tokens[index] = (probs / noise).argmax(dim=-1)
    return tokens.tolist()


def step_generator(seed: int, step: int, device: torch.device) -> torch.Generator:
    """The generator for one request's `step`-th token: a pure function of (seed, step)."""
    return torch.Generator(device=device).manual_seed(_mix(seed, step))


def _truncate(
    logits: torch.Tensor, params: list[SamplingParams], top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Mask everything outside each row's top-k, then outside its top-p nucleus."""
    if all(p.top_k == 0 and p.top_p >= 1.0 for p in params):
        return logits
    vocab = logits.shape[-1]
    ordered, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)
    ordered = ordered.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf"))
    probs = ordered.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    ordered = ordered.masked_fill(mass_before >= top_p[:, None], float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, ordered)


def _exponential_noise(
    probs: torch.Tensor, params: list[SamplingParams], steps: list[int]
) -> torch.Tensor:
    """Exp(1) noise per row: seeded rows from their own generator, the rest in one draw."""
    noise = torch.empty_like(probs).exponential_()
    for row, (p, step) in enumerate(zip(params, steps, strict=True)):
        if p.seed is not None:
            generator = step_generator(p.seed, step, probs.device)
            noise[row].exponential_(generator=generator)
    return noise.clamp_(min=torch.finfo(noise.dtype).tiny)  # a zero draw would divide by zero


def _mix(seed: int, step: int) -> int:
    """Spread (seed, step) over 63 bits with splitmix64's finaliser, so nearby seeds differ."""
    x = (seed * 0x9E3779B97F4A7C15 + step + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1
