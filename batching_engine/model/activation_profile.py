"""Measure, on a GPU, the memory a worst-case step needs beyond the weights and the cache.

The KV cache gets what the budget leaves, so the activation peak must be known before the
cache is allocated. It is measured, not estimated: one dummy step with the full token budget
as prefill, one decode of the most sequences at the longest context, each followed by
sampling with top-k and top-p (whose sort is the sampler's largest buffer). The decode's
forward pass is also measured alone: captured CUDA graphs keep that much in their own pool.

Only activations are measured: the dummy steps read and write a scratch cache of one longest
sequence, allocated before any measured window (the real cache is counted apart, by the
budget), and they run the step's own code path, paged attention over that cache, so the
attention call has the shapes and the kernel of a real step (not SDPA on 3-D tensors, whose
math fallback needs memory quadratic in the sequence length).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from batching_engine.model.kv_cache import KVCacheLayout, KVCaches
from batching_engine.model.llama import LlamaForCausalLM
from batching_engine.model.step_metadata import paged_metadata
from batching_engine.sampler import sample
from batching_engine.sequence import SamplingParams

# How far a run raises the allocated memory above where it started, in bytes.
Meter = Callable[[Callable[[], None]], int]


@dataclass(frozen=True, slots=True)
class ActivationPeaks:
    step: int  # bytes the largest eager step (forward and sampling) allocates at its peak
    decode_forward: int  # bytes a decode forward at max_num_seqs allocates at its peak


@torch.inference_mode()
def activation_peaks(
    model: LlamaForCausalLM,
    layout: KVCacheLayout,
    device: torch.device,
    *,
    max_model_len: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    meter: Meter | None = None,
) -> ActivationPeaks:
    """`meter` replaces the CUDA allocator's peak statistics (how this is tested on a CPU)."""
    measure = meter if meter is not None else _cuda_meter(device)
    scratch = layout.allocate(layout.blocks_needed(max_model_len), device)
    prefill = measure(
        lambda: _dummy_prefill(
            model, scratch, layout, device, max_model_len, max_num_seqs, max_num_batched_tokens
        )
    )
    hidden: list[torch.Tensor] = []
    forward = measure(
        lambda: hidden.append(
            _dummy_decode(model, scratch, layout, device, max_model_len, max_num_seqs)
        )
    )
    sampling = measure(lambda: _dummy_sample(model, hidden.pop(), max_num_seqs))
    scratch.clear()  # the scratch cache goes before the real one is allocated
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return ActivationPeaks(step=max(prefill, forward + sampling), decode_forward=forward)


def _cuda_meter(device: torch.device) -> Meter:
    def peak_bytes(run: Callable[[], None]) -> int:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        run()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before

    return peak_bytes


def _dummy_prefill(
    model: LlamaForCausalLM, caches: KVCaches, layout: KVCacheLayout, device: torch.device,
    max_model_len: int, max_num_seqs: int, max_num_batched_tokens: int,
) -> None:  # fmt: skip
    """The whole token budget as prompts of the longest length, through paged attention as a
    step runs them; every prompt writes and reads the same scratch blocks."""
    full, rest = divmod(max_num_batched_tokens, max_model_len)
    lens = [max_model_len] * full + ([rest] if rest else [])
    table = list(range(layout.blocks_needed(max_model_len)))
    meta = paged_metadata([0] * len(lens), lens, [table] * len(lens), layout.block_size, device)
    ids = torch.zeros(sum(lens), dtype=torch.long, device=device)
    _dummy_sample(model, model(ids, meta, caches), max_num_seqs)


def _dummy_decode(
    model: LlamaForCausalLM, caches: KVCaches, layout: KVCacheLayout, device: torch.device,
    max_model_len: int, max_num_seqs: int,
) -> torch.Tensor:  # fmt: skip
    """Every sequence reads the same blocks: the size of the gather is what matters."""
    table = list(range(layout.blocks_needed(max_model_len)))
    meta = paged_metadata(
        [max_model_len - 1] * max_num_seqs, [1] * max_num_seqs, [table] * max_num_seqs,
        layout.block_size, device,
    )  # fmt: skip
    ids = torch.zeros(max_num_seqs, dtype=torch.long, device=device)
    return model(ids, meta, caches)


def _dummy_sample(model: LlamaForCausalLM, hidden: torch.Tensor, max_num_seqs: int) -> None:
    rows = hidden[:max_num_seqs]
    nucleus = SamplingParams(temperature=1.0, top_p=0.9, top_k=50)
    sample(model.compute_logits(rows), [nucleus] * rows.shape[0], [0] * rows.shape[0])
