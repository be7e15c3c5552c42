"""The CPU's quantized matmul: `cpu_quantized_matmul.c` (built and loaded by `cpu_build`).

torch's weight-only CPU kernels (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`) took
6-8x (int8) and 16-19x (int4) float32's time on a 2-core AVX-512 EPYC (bench/quantized_matmul.py).
This one reads the codes directly for few rows and converts each strip of the weight once for
many, so it runs several times faster than float32 at one row and as fast at 64. Where it cannot
be built, `available()` says why and the caller keeps its dequantizing path.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Final

import torch

from batching_engine.kernels import cpu_build

SOURCE: Final = Path(__file__).with_suffix(".c")
GROUP: Final = 32  # int4 group size along the input


def _library() -> ctypes.CDLL | str:
    """The loaded kernel, or why there is none."""
    return cpu_build.load(SOURCE, _declare)


def _declare(library: ctypes.CDLL) -> None:
    library.quantized_matmul_strip.restype = ctypes.c_int
    library.quantized_matmul.restype = ctypes.c_int
    library.quantized_matmul.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
    ]  # fmt: skip


def available() -> str | None:
    """None when the kernel is ready; else why it cannot be used here."""
    library = _library()
    return library if isinstance(library, str) else None


def strip() -> int:
    """How many output columns the built kernel takes together: the packing's unit."""
    library = _library()
    if isinstance(library, str):
        raise RuntimeError(f"the CPU quantized matmul is unavailable: {library}")
    return library.quantized_matmul_strip()


def pack_int8(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes [n, k] and float scales [n] as the kernel reads them: [strips, k, 16] and
    [strips, 16], the columns padded to whole strips with zero codes."""
    n, k = codes.shape
    width = strip()
    strips = -(-n // width)
    padded = _pad_rows(codes, strips * width)
    packed = padded.view(strips, width, k).transpose(1, 2).contiguous()
    return packed, _pad_rows(scales.float(), strips * width).view(strips, width)


def pack_int4(
    codes: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """int4 codes [n, k] (uint8, 0..15), scales and minima [n, k / 32] as the kernel reads
    them: bytes [strips, k / 2, 16] holding codes k (high nibble) and k + 1 (low), and
    [strips, groups, 16] each for the scales and minima."""
    n, k = codes.shape
    width = strip()
    strips = -(-n // width)
    padded = _pad_rows(codes, strips * width)
    pairs = (padded[:, 0::2] << 4 | padded[:, 1::2]).to(torch.uint8)
    packed = pairs.view(strips, width, k // 2).transpose(1, 2).contiguous()

    def per_group(values: torch.Tensor) -> torch.Tensor:
        padded_values = _pad_rows(values.float(), strips * width)
        return padded_values.view(strips, width, -1).transpose(1, 2).contiguous()

    return packed, per_group(scales), per_group(lows)


def unpack_int8_rows(packed: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The int8 codes of weight rows `rows` ([r] int64) from `pack_int8`'s layout: [r, k]."""
    width = packed.shape[-1]
    return packed[rows // width, :, rows % width]


def matmul_int8(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, n: int) -> torch.Tensor:
    """x [..., k] float32 @ the int8 weight [n, k] that `pack_int8` packed: [..., n]."""
    return _call(8, x, codes, scales, None, n)


def matmul_int4(
    x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor, n: int
) -> torch.Tensor:
    """x [..., k] float32 @ the int4 weight [n, k] that `pack_int4` packed: [..., n]."""
    return _call(4, x, codes, scales, lows, n)


def _call(
    mode: int,
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    lows: torch.Tensor | None,
    n: int,
) -> torch.Tensor:
    library = _library()
    if isinstance(library, str):
        raise RuntimeError(f"the CPU quantized matmul is unavailable: {library}")
    if codes.shape[-1] != library.quantized_matmul_strip():
        raise RuntimeError(
            f"weights packed in strips of {codes.shape[-1]} for a kernel that reads"
            f" {library.quantized_matmul_strip()}: pack them after choosing {cpu_build.ENV_VAR}"
        )
    k = x.shape[-1]
    _check_shapes(mode, k, codes, scales, lows, n)
    flat = x.reshape(-1, k)
    if flat.dtype != torch.float32 or flat.stride(-1) != 1:
        flat = flat.float().contiguous()
    y = x.new_empty(flat.shape[0], n, dtype=torch.float32)
    failed = library.quantized_matmul(
        mode, flat.data_ptr(), flat.shape[0], flat.stride(0), k, codes.data_ptr(),
        scales.data_ptr(), lows.data_ptr() if lows is not None else None, n, y.data_ptr(),
    )  # fmt: skip
    if failed:
        raise MemoryError("the CPU quantized matmul could not allocate its strip buffer")
    return y.view(*x.shape[:-1], n)


def _check_shapes(
    mode: int,
    k: int,
    codes: torch.Tensor,
    scales: torch.Tensor,
    lows: torch.Tensor | None,
    n: int,
) -> None:
    """The kernel trusts its pointers: refuse any call whose tensors it would overrun."""
    strips, width = codes.shape[0], codes.shape[-1]
    rows = k if mode == 8 else k // 2
    groups = () if mode == 8 else (k // GROUP,)
    problems = [
        codes.shape != (strips, rows, width) and f"codes {tuple(codes.shape)} for k={k}",
        mode == 4 and k % GROUP and f"k={k} is not a multiple of {GROUP}",
        not 0 < n <= strips * width and f"n={n} does not fit {strips} strips of {width}",
        scales.shape != (strips, *groups, width) and f"scales {tuple(scales.shape)}",
        lows is not None and lows.shape != scales.shape and f"lows {tuple(lows.shape)}",
        not all(t.is_contiguous() for t in (codes, scales)) and "packed tensors must be contiguous",
    ]
    found = [p for p in problems if p]
    if found:
        raise ValueError(f"quantized matmul: {'; '.join(found)}")


def _pad_rows(values: torch.Tensor, rows: int) -> torch.Tensor:
    padded = values.new_zeros(rows, *values.shape[1:])
    padded[: values.shape[0]] = values
    return padded
