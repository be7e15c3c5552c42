"""The functions the model calls: each runs the Triton kernel on CUDA tensors, and the torch
reference elsewhere, except where `cpu_decode`'s C kernels take float32 CPU tensors (norm,
rotary, KV-cache write, decode attention: one call each instead of many torch ops), whose KV
caches may be float16 (the engine's on the CPU: `model/kv_cache.py`) or float32.

One switch forces a path for the whole process: the environment variable
`INFERGRID_KERNELS=auto|triton|torch` (read at import; an unknown value fails then, not at the
first request), or `set_kernel_backend()`. Forcing `triton` on CPU tensors raises a clear error;
forcing `torch` gives the reference path on a GPU (how the engine's greedy-token parity check
compares the two) and on the CPU (the C kernels' tests compare against it).
"""

from __future__ import annotations

import os
from typing import Literal, get_args

import torch

from . import cpu_decode as _cpu
from . import decode_attention as _decode
from . import kv_cache_write as _kv_write
from . import prefill_attention as _prefill
from . import rmsnorm as _rmsnorm
from . import rotary as _rotary
from . import silu_and_mul as _silu

Backend = Literal["auto", "triton", "torch"]
BACKENDS: tuple[str, ...] = get_args(Backend)
ENV_VAR = "INFERGRID_KERNELS"


def _parse_backend(value: str, source: str) -> Backend:
    backend = value.strip().lower()
    if backend not in BACKENDS:
        raise ValueError(f"{source}: {value!r} is not one of {', '.join(BACKENDS)}")
    return backend  # type: ignore[return-value]


_backend: Backend = _parse_backend(os.environ.get(ENV_VAR, "auto"), ENV_VAR)


def set_kernel_backend(backend: str) -> None:
    """Force `triton` or `torch` for every kernel call from now on, or go back to `auto`."""
    global _backend
    _backend = _parse_backend(backend, "kernel backend")


def kernel_backend() -> Backend:
    return _backend


def uses_triton(tensor: torch.Tensor) -> bool:
    """Whether a call on `tensor` takes the Triton path under the current switch."""
    if _backend == "auto":
        return tensor.is_cuda
    return _backend == "triton"


def uses_cpu_kernels(*tensors: torch.Tensor) -> bool:
    """Whether a call on `tensors` takes `cpu_decode`'s C kernels under the current switch."""
    return _backend == "auto" and _cpu.applies(*tensors)


def uses_reference(tensor: torch.Tensor) -> bool:
    """Whether a decode-attention call on `tensor` takes the torch reference (which wants a
    `DecodePlan`)."""
    return not uses_triton(tensor) and not uses_cpu_kernels(tensor)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    plan: _decode.DecodePlan | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """q `[num_seqs, num_heads, head_dim]`, one token per sequence at position
    `context_lens[s] - 1` (its K/V already written) -> attention output, same shape.
    Graph-safe on the Triton path: no host sync; rows with context length 0 give zeros.
    `plan` (`decode_plan`, the torch path's only) spares rebuilding it at every layer.
    `window`: a sliding-window layer's, the last `window` cached tokens only. `softcap`:
    each score s becomes softcap * tanh(s / softcap) before the softmax (None or 0: off)."""
    if uses_triton(q):
        return _decode.decode_attention_triton(
            q, k_cache, v_cache, block_tables, context_lens, scale, window=window,
            softcap=softcap,
        )  # fmt: skip
    if uses_cpu_kernels(q) and _cpu.holds(k_cache, v_cache):
        scale = _decode.default_scale(q) if scale is None else scale
        return _cpu.decode_attention(
            q, k_cache, v_cache, block_tables, context_lens, scale, window, softcap
        )
    return _decode.decode_attention_reference(
        q, k_cache, v_cache, block_tables, context_lens, scale, plan, window, softcap
    )


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float | None = None,
    max_query_len: int | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """q `[num_tokens, num_heads, head_dim]`, the flattened chunks (`cu_seqlens_q`), each the
    last tokens of its sequence's `context_lens[s]` cached tokens (their K/V written first).
    Pass `max_query_len` to spare a device sync. `window`, `softcap`: as decode_attention's."""
    if uses_triton(q):
        return _prefill.prefill_attention_triton(
            q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale, max_query_len,
            window=window, softcap=softcap,
        )  # fmt: skip
    return _prefill.prefill_attention_reference(
        q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale, window, softcap
    )


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store key/value `[num_tokens, num_kv_heads, head_dim]` into their slots, in the cache's
    dtype; -1 skips."""
    if uses_triton(key):
        _kv_write.write_kv_cache_triton(key, value, k_cache, v_cache, slot_mapping)
    elif uses_cpu_kernels(key, value) and _cpu.holds(k_cache, v_cache):
        _cpu.write_kv_cache(key, value, k_cache, v_cache, slot_mapping)
    else:
        _kv_write.write_kv_cache_reference(key, value, k_cache, v_cache, slot_mapping)


def fused_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(rmsnorm(x + residual) * weight, x + residual)`; with residual None, `(rmsnorm(x), x)`.
    x `[num_tokens, hidden]`."""
    if uses_triton(x):
        return _rmsnorm.fused_add_rmsnorm_triton(x, residual, weight, eps)
    if uses_cpu_kernels(x, weight, *([] if residual is None else [residual])):
        return _cpu.fused_add_rmsnorm(x, residual, weight, eps)
    return _rmsnorm.fused_add_rmsnorm_reference(x, residual, weight, eps)


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q `[T, H, D]` and k `[T, KVH, D]` at `positions` (`[T]`) with cos/sin caches
    `[max_pos, rotary_dim]` (HF `rotate_half` layout); new tensors are returned."""
    if uses_triton(q):
        return _rotary.rotary_embedding_triton(positions, q, k, cos, sin)
    if uses_cpu_kernels(q, k, cos, sin):
        return _cpu.rotary_embedding(positions, q, k, cos, sin)
    return _rotary.rotary_embedding_reference(positions, q, k, cos, sin)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """`[..., 2*d]` (gate | up) -> `silu(gate) * up`, `[..., d]`."""
    if uses_triton(x):
        return _silu.silu_and_mul_triton(x)
    return _silu.silu_and_mul_reference(x)
