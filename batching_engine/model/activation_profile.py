"""Measure, on a GPU, the memory a worst-case step needs beyond the weights and the cache.

The KV cache gets what the budget leaves, so the activation peak must be known before the
cache is allocated. It is measured, not estimated: one dummy step with the full token budget
as prefill, one decode of the most sequences at the longest context, each followed by
sampling with top-k and top-p (whose sort is the sampler's largest buffer). The decode's
forward pass is also measured alone: captured CUDA graphs keep that much in their own pool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from batching_engine.model.kv_cache import KVCacheLayout
from batching_engine.model.llama import LlamaForCausalLM
from batching_engine.model.step_metadata import dense_metadata, paged_metadata
from batching_engine.sampler import sample
from batching_engine.sequence import SamplingParams


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
) -> ActivationPeaks:
    prefill = _peak_bytes(
        device,
        lambda: _dummy_prefill(model, device, max_model_len, max_num_seqs, max_num_batched_tokens),
    )
    hidden: list[torch.Tensor] = []
    forward = _peak_bytes(
        device,
        lambda: hidden.append(_dummy_decode(model, layout, device, max_model_len, max_num_seqs)),
    )
    sampling = _peak_bytes(device, lambda: _dummy_sample(model, hidden.pop(), max_num_seqs))
    torch.cuda.empty_cache()
    return ActivationPeaks(step=max(prefill, forward + sampling), decode_forward=forward)


def _peak_bytes(device: torch.device, run: Callable[[], None]) -> int:
    """How far `run` raises the allocated memory above where it started."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    run()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def _dummy_prefill(
    model: LlamaForCausalLM, device: torch.device, max_model_len: int, max_num_seqs: int,
    max_num_batched_tokens: int,
) -> None:  # fmt: skip
    full, rest = divmod(max_num_batched_tokens, max_model_len)
    lens = [max_model_len] * full + ([rest] if rest else [])
    ids = torch.zeros(sum(lens), dtype=torch.long, device=device)
    _dummy_sample(model, model.model(ids, dense_metadata(lens, device)), max_num_seqs)


def _dummy_decode(
    model: LlamaForCausalLM, layout: KVCacheLayout, device: torch.device, max_model_len: int,
    max_num_seqs: int,
) -> torch.Tensor:  # fmt: skip
    """Every sequence reads the same blocks: the size of the gather is what matters."""
    needed = layout.blocks_needed(max_model_len)
    caches = layout.allocate(needed, device)
    table = list(range(needed))
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
