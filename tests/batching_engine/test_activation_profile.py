"""The activation profile measures what a step needs beyond the weights and the KV cache.

No GPU here: the CUDA allocator's peak statistics are replaced by a meter that records its
windows, and the dummy steps run the real model (the torch path) on the CPU.
"""

from __future__ import annotations

import pytest
import torch

from batching_engine.model import llama
from batching_engine.model.activation_profile import ActivationPeaks, activation_peaks
from batching_engine.model.attention import DenseAttentionMetadata
from batching_engine.model.kv_cache import KVCacheLayout
from batching_engine.model.loader import load_model
from harness.tiny_llama import save_tiny_llama

MAX_MODEL_LEN, MAX_NUM_SEQS, TOKEN_BUDGET = 48, 3, 100


class WindowMeter:
    """Runs each measured window and says 100, 200, 300 bytes in turn."""

    def __init__(self) -> None:
        self.inside = False
        self.windows = 0

    def __call__(self, run) -> int:
        self.inside = True
        try:
            run()
        finally:
            self.inside = False
        self.windows += 1
        return 100 * self.windows


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path)
    config, model = load_model(path, dtype=torch.float32, device="cpu")
    return model, KVCacheLayout.for_model(config, 16, torch.float32)


def profile(model, layout, meter) -> ActivationPeaks:
    return activation_peaks(
        model, layout, torch.device("cpu"), max_model_len=MAX_MODEL_LEN,
        max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=TOKEN_BUDGET, meter=meter,
    )  # fmt: skip


def test_the_kv_cache_is_allocated_outside_every_measured_window(model, monkeypatch):
    """The budget counts the real cache apart: the scratch cache the dummy steps use must not
    be in a window (it was in the decode's, and so counted twice with the graphs' pool)."""
    model, layout = model
    meter, allocations = WindowMeter(), []
    allocate = KVCacheLayout.allocate

    def recording_allocate(self, num_blocks, device):
        allocations.append((num_blocks, meter.inside))
        return allocate(self, num_blocks, device)

    monkeypatch.setattr(KVCacheLayout, "allocate", recording_allocate)
    peaks = profile(model, layout, meter)
    assert allocations == [(layout.blocks_needed(MAX_MODEL_LEN), False)]
    # prefill 100, decode forward 200, its sampling 300
    assert peaks == ActivationPeaks(step=200 + 300, decode_forward=200)


def test_the_dummy_steps_call_attention_as_a_real_step_does(model, monkeypatch):
    """Paged attention over the flat batch, as the runner's steps call it: never the dense
    path's SDPA on 3-D tensors (on a GPU its math fallback is quadratic in memory)."""
    model, layout = model
    calls = []
    paged = llama.paged_attention

    def dense(*args, **kwargs):
        raise AssertionError("the profile took the dense (single-pass) attention path")

    def recording_paged(q, k_cache, v_cache, meta, scale, window, softcap):
        assert not isinstance(meta, DenseAttentionMetadata)
        calls.append((tuple(q.shape), meta.num_prefill_seqs, meta.num_prefill_tokens))
        return paged(q, k_cache, v_cache, meta, scale, window, softcap)

    monkeypatch.setattr(llama, "dense_causal_attention", dense)
    monkeypatch.setattr(llama, "paged_attention", recording_paged)
    profile(model, layout, WindowMeter())
    config = model.model.layers[0].self_attn
    heads, head_dim = config.num_heads, layout.head_dim
    layers = len(model.model.layers)
    prefill = ((TOKEN_BUDGET, heads, head_dim), 3, TOKEN_BUDGET)  # 48 + 48 + 4 tokens
    decode = ((MAX_NUM_SEQS, heads, head_dim), 0, 0)
    assert calls == [prefill] * layers + [decode] * layers
