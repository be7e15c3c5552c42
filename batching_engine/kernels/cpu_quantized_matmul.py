"""The CPU's quantized matmul: `cpu_quantized_matmul.c` (built and loaded by `cpu_build`).

torch's weight-only CPU kernels (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`) took
6-8x (int8) and 16-19x (int4) float32's time on a 2-core AVX-512 EPYC (bench/quantized_matmul.py).
Where the CPU has VNNI, this one quantizes x per block of 32 to int8 (as llama.cpp's Q8
activations) and multiplies codes by codes with integer dot products; elsewhere it multiplies x
as given in float, reading the codes directly for few rows and converting each strip of the
weight once for many. The two builds lay the weights out differently (`pack_int8`,
`pack_int4`; `PackedWeight.vnni` says which). Where none can be built, `available()` says why
and the caller keeps its dequantizing path.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
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
    library.quantized_matmul_vnni.restype = ctypes.c_int
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
    return _ready().quantized_matmul_strip()


def vnni() -> bool:
    """Whether the built kernel multiplies int8-quantized x with VNNI (and reads its layout)."""
    return bool(_ready().quantized_matmul_vnni())


def _ready() -> ctypes.CDLL:
    library = _library()
    if isinstance(library, str):
        raise RuntimeError(f"the CPU quantized matmul is unavailable: {library}")
    return library


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """A weight [n, k] laid out as the kernel reads it (`pack_int8`, `pack_int4`), checked once
    here so that a call need only check its input's width: the kernel trusts its pointers.
    `vnni`: laid out for the VNNI build (4 consecutive k a 32-bit lane), else the float one."""

    mode: int  # 8 or 4
    codes: torch.Tensor  # see `code_shape`
    scales: torch.Tensor  # [strips, strip] (int8) or [strips, k / 32, strip] (int4), float32
    lows: torch.Tensor | None  # int4's minima, shaped as its scales
    n: int
    k: int
    vnni: bool = False

    def __post_init__(self) -> None:
        strips, width = self.codes.shape[0], self.codes.shape[-1 - self.vnni]
        groups = () if self.mode == 8 else (self.k // GROUP,)
        problems = [
            self.mode not in (4, 8) and f"mode {self.mode}",
            self.codes.shape != code_shape(self.mode, self.k, strips, width, self.vnni)
            and f"codes {tuple(self.codes.shape)}",
            self.mode == 4 and self.k % GROUP and f"k={self.k} is not a multiple of {GROUP}",
            not 0 < self.n <= strips * width and f"n={self.n} in {strips} strips of {width}",
            self.scales.shape != (strips, *groups, width) and f"scales {self.scales.shape}",
            (self.lows is None) != (self.mode == 8) and "lows belong to int4 alone",
            self.lows is not None and self.lows.shape != self.scales.shape and "lows' shape",
            self.scales.dtype != torch.float32 and f"scales {self.scales.dtype}",
            not all(t.is_contiguous() for t in self.tensors) and "not contiguous",
        ]
        found = [p for p in problems if p]
        if found:
            raise ValueError(f"packed weight [{self.n}, {self.k}]: {'; '.join(found)}")

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.codes, self.scales) + ((self.lows,) if self.lows is not None else ())


def code_shape(mode: int, k: int, strips: int, width: int, vnni: bool) -> tuple[int, ...]:
    """The packed codes' shape. Float build: int8 [strips, k, strip], int4 [strips, k / 2,
    strip] (a byte holds k and k + 1). VNNI build: int8 [strips, k' / 4, strip, 4] (k' = k
    padded to whole blocks of 32), int4 [strips, k / 8, strip, 4] (a byte holds k and k + 4)."""
    if not vnni:
        return (strips, k if mode == 8 else k // 2, width)
    return (strips, -(-k // GROUP) * GROUP // 4 if mode == 8 else k // 8, width, 4)


def pack_int8(codes: torch.Tensor, scales: torch.Tensor) -> PackedWeight:
    """int8 codes [n, k] and scales [n] as the kernel reads them (`code_shape`), and scales
    [strips, strip], the columns padded to whole strips with zero codes. For VNNI each code is
    stored + 128 as a uint8 (vpdpbusd multiplies unsigned by signed bytes), k padded to whole
    blocks of 32 with zero codes."""
    n, k = codes.shape
    width, four_k = strip(), vnni()
    strips = -(-n // width)
    padded = _pad_rows(codes, strips * width)
    if four_k:
        padded = torch.nn.functional.pad(padded, (0, -(-k // GROUP) * GROUP - k))
        padded = padded.view(torch.uint8) ^ 0x80
        packed = padded.view(strips, width, -1, 4).transpose(1, 2).contiguous()
    else:
        packed = padded.view(strips, width, k).transpose(1, 2).contiguous()
    scales = _pad_rows(scales.float(), strips * width).view(strips, width)
    return PackedWeight(8, packed, scales, None, n, k, four_k)


def pack_int4(codes: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor) -> PackedWeight:
    """int4 codes [n, k] (uint8, 0..15), scales and minima [n, k / 32] as the kernel reads
    them: bytes of two codes each (`code_shape`), and [strips, groups, strip] each for the
    scales and minima."""
    n, k = codes.shape
    width, four_k = strip(), vnni()
    strips = -(-n // width)
    padded = _pad_rows(codes, strips * width)
    if four_k:  # per 8 k: k..k+3 in the low nibbles of a lane's 4 bytes, k+4..k+7 the high
        eights = padded.view(strips, width, k // 8, 2, 4)
        pairs = (eights[..., 0, :] | eights[..., 1, :] << 4).to(torch.uint8)
        packed = pairs.transpose(1, 2).contiguous()
    else:
        pairs = nibble_pairs(padded)
        packed = pairs.view(strips, width, k // 2).transpose(1, 2).contiguous()

    def per_group(values: torch.Tensor) -> torch.Tensor:
        padded_values = _pad_rows(values.float(), strips * width)
        return padded_values.view(strips, width, -1).transpose(1, 2).contiguous()

    return PackedWeight(4, packed, per_group(scales), per_group(lows), n, k, four_k)


def nibble_pairs(codes: torch.Tensor) -> torch.Tensor:
    """int4 codes [n, k] (0..15) two a byte, [n, k / 2]: code k in the high nibble, k + 1 in
    the low, as this kernel and the dequantizing path both read them."""
    return (codes[:, 0::2] << 4 | codes[:, 1::2]).to(torch.uint8).contiguous()


def unpack_int8_rows(weight: PackedWeight, rows: torch.Tensor) -> torch.Tensor:
    """The int8 codes of weight rows `rows` ([r] int64) from `pack_int8`'s layout: [r, k]."""
    width = weight.codes.shape[-1 - weight.vnni]
    codes = weight.codes[rows // width, :, rows % width]
    if not weight.vnni:
        return codes
    return (codes.reshape(len(rows), -1)[:, : weight.k] ^ 0x80).view(torch.int8)


def layout(weight: PackedWeight) -> tuple[int, bool]:
    """(strip, vnni): the layout a weight was packed in, which the loaded build must read."""
    return weight.codes.shape[-1 - weight.vnni], weight.vnni


def reads() -> tuple[int, bool]:
    """(strip, vnni): the layout the loaded build reads, as `layout` names a weight's."""
    return strip(), vnni()


def matmul(x: torch.Tensor, weight: PackedWeight) -> torch.Tensor:
    """x [..., k] float32 @ the packed weight's [n, k] transposed: [..., n]."""
    library = _ready()
    packed_for, read = layout(weight), reads()
    if packed_for != read:
        raise RuntimeError(
            f"weights packed for (strip, vnni) {packed_for}, a kernel that reads {read}:"
            f" pack them after choosing {cpu_build.ENV_VAR}"
        )
    k, n = weight.k, weight.n
    if x.shape[-1] != k:
        raise ValueError(f"x: {x.shape[-1]} columns for a weight of {k}")
    flat = x.reshape(-1, k)
    if flat.dtype != torch.float32 or flat.stride(-1) != 1:
        flat = flat.float().contiguous()
    y = x.new_empty(flat.shape[0], n, dtype=torch.float32)
    lows = weight.lows.data_ptr() if weight.lows is not None else None
    failed = library.quantized_matmul(
        weight.mode, flat.data_ptr(), flat.shape[0], flat.stride(0), k,
        weight.codes.data_ptr(), weight.scales.data_ptr(), lows, n, y.data_ptr(),
    )  # fmt: skip
    if failed:
        raise MemoryError("the CPU quantized matmul could not allocate its strip buffer")
    return y.view(*x.shape[:-1], n)


def _pad_rows(values: torch.Tensor, rows: int) -> torch.Tensor:
    padded = values.new_zeros(rows, *values.shape[1:])
    padded[: values.shape[0]] = values
    return padded
