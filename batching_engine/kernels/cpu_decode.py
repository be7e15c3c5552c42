"""A decode step's per-layer work besides the matmuls, on the CPU in float32 (residual add and
RMSNorm, rotary, the KV-cache write, decode attention): `cpu_decode.c`, built and loaded by
`cpu_build`, one call each where torch takes 30-odd ops a layer. `dispatch` calls these for
float32 CPU tensors, over KV caches of float16 (the engine's on the CPU) or float32, when the
library is built, and the torch references otherwise (or when `INFERGRID_KERNELS=torch` asks
for them).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Final

import torch

from batching_engine.kernels import cpu_build

SOURCE: Final = Path(__file__).with_suffix(".c")
# Rotary rounds as torch does only without fused multiply-adds (see the source's note).
_FLAGS: Final = ("-ffp-contract=off",)
_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# The KV-cache dtypes the kernels read and write (a float16 cache is converted in C).
CACHE_DTYPES: Final = (torch.float32, torch.float16)


def _declare(library: ctypes.CDLL) -> None:
    library.rotary.argtypes = [_P, _I64, _P, _I64, _I64, _I64, _P, _P, _I64, _I64, _P]
    library.write_kv.argtypes = [_P, _I64, _P, _I64, _I64, _I64, _P, _P, _P, _I64, _INT]
    library.decode_attention.argtypes = [
        _P, _I64, _I64, _I64, _I64, _P, _P, _INT, _I64, _I64, _P, _I64, _P, ctypes.c_float,
        _I64, ctypes.c_float, _P,
    ]  # fmt: skip
    for name in ("rotary", "write_kv", "decode_attention"):
        getattr(library, name).restype = ctypes.c_int
    library.add_rmsnorm.argtypes = [_P, _I64, _P, _I64, _P, _I64, _I64, ctypes.c_float, _P, _P]
    library.add_rmsnorm.restype = None


def _library() -> ctypes.CDLL | str:
    return cpu_build.load(SOURCE, _declare, _FLAGS)


def available() -> str | None:
    """None when the library is ready; else why it cannot be used here."""
    library = _library()
    return library if isinstance(library, str) else None


def applies(*tensors: torch.Tensor) -> bool:
    """Whether these tensors take this path: float32 on the CPU, with the library built."""
    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors) and (
        available() is None
    )


def holds(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether the kernels read and write these KV caches: CPU tensors of one `CACHE_DTYPES`."""
    return (
        k_cache.dtype == v_cache.dtype
        and k_cache.dtype in CACHE_DTYPES
        and k_cache.device.type == v_cache.device.type == "cpu"
    )


def fused_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """What `rmsnorm.fused_add_rmsnorm_reference` returns, within float32 rounding."""
    x, weight = _rows(x), weight.contiguous()
    rows, hidden = x.shape
    if residual is not None:
        residual = _rows(residual)
        if residual.shape != x.shape:
            raise ValueError(f"residual: shape {tuple(residual.shape)}, x {tuple(x.shape)}")
    if weight.shape != (hidden,):
        raise ValueError(f"weight: shape {tuple(weight.shape)} for hidden size {hidden}")
    out, summed = torch.empty(rows, hidden), torch.empty(rows, hidden)
    _call().add_rmsnorm(
        x.data_ptr(), x.stride(0), residual.data_ptr() if residual is not None else None,
        residual.stride(0) if residual is not None else 0, weight.data_ptr(), rows, hidden,
        eps, out.data_ptr(), summed.data_ptr(),
    )  # fmt: skip
    return out, summed


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What `rotary.rotary_embedding_reference` returns, bitwise."""
    positions = _contiguous(positions, torch.int64)
    cos, sin = cos.contiguous(), sin.contiguous()
    return _rotate(positions, q, cos, sin), _rotate(positions, k, cos, sin)


def _rotate(
    positions: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    x = _rows_of_heads(x)
    tokens, heads, head_dim = x.shape
    out = torch.empty(tokens, heads, head_dim, dtype=x.dtype)
    _check(
        _call().rotary(
            positions.data_ptr(), tokens, x.data_ptr(), x.stride(0), heads, head_dim,
            cos.data_ptr(), sin.data_ptr(), cos.shape[0], cos.shape[1], out.data_ptr(),
        ),
        "rotary: a position is outside the cos/sin table",
    )  # fmt: skip
    return out


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """What `kv_cache_write.write_kv_cache_reference` does, bitwise: rows into their slots
    (rounded as `.half()` rounds, into a float16 cache), -1 skips."""
    half = _cache_is_half(k_cache, v_cache)
    key, value = _rows_of_heads(key), _rows_of_heads(value)
    slots = _contiguous(slot_mapping, torch.int64)
    row = key.shape[1] * key.shape[2]
    _check(
        _call().write_kv(
            key.data_ptr(), key.stride(0), value.data_ptr(), value.stride(0), key.shape[0], row,
            slots.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), k_cache.numel() // row,
            half,
        ),
        "write_kv_cache: a slot is outside the cache",
    )  # fmt: skip


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """What `decode_attention.decode_attention_reference` returns, within float32 rounding;
    `window`: attend to the last `window` cached tokens only; `softcap`: cap each score s at
    softcap * tanh(s / softcap)."""
    half = _cache_is_half(k_cache, v_cache)
    q = q.contiguous()
    seqs, heads, head_dim = q.shape
    num_blocks, block_size, kv_heads, _ = k_cache.shape
    tables = _contiguous(block_tables, torch.int32)
    lens = _contiguous(context_lens, torch.int32)
    out = torch.empty_like(q)
    _check(
        _call().decode_attention(
            q.data_ptr(), seqs, heads, kv_heads, head_dim, k_cache.data_ptr(),
            v_cache.data_ptr(), half, num_blocks, block_size, tables.data_ptr(), tables.shape[1],
            lens.data_ptr(), scale, window or 0, softcap or 0.0, out.data_ptr(),
        ),
        "decode_attention: a context length or block id is outside the cache, the heads"
        " do not divide into the KV heads, or the window or soft cap is negative",
    )  # fmt: skip
    return out


def _call() -> ctypes.CDLL:
    library = _library()
    if isinstance(library, str):
        raise RuntimeError(f"the CPU decode kernels are unavailable: {library}")
    return library


def _check(status: int, message: str) -> None:
    if status != 0:
        raise ValueError(message)


def _cache_is_half(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether the caches hold float16 (else float32); refused unless the kernels take them."""
    if not holds(k_cache, v_cache):
        raise ValueError(
            f"the CPU decode kernels need K and V caches of one of {CACHE_DTYPES} on the CPU,"
            f" got {k_cache.dtype} and {v_cache.dtype}"
        )
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the CPU decode kernels need contiguous K and V caches")
    return k_cache.dtype == torch.float16


def _rows_of_heads(x: torch.Tensor) -> torch.Tensor:
    """x [tokens, heads, head_dim] with each token's heads contiguous (rows may be apart)."""
    if x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x
    return x.contiguous()


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [rows, n] with each row contiguous (rows may be apart)."""
    if x.dim() != 2:
        raise ValueError(f"expected [rows, hidden], got shape {tuple(x.shape)}")
    return x if x.stride(1) == 1 else x.contiguous()


def _contiguous(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).contiguous()
