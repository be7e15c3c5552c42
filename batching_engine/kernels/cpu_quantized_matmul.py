"""The CPU's quantized matmul: `cpu_quantized_matmul.c`, built once with the system's C compiler
and called through ctypes.

torch's weight-only kernels (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`) vectorise for
AVX-512 only; on an AVX2 CPU they are slower than float32 (bench/quantized_matmul.py). This
kernel is for AVX2 + FMA, the x86 baseline of the last decade. Its threads are OpenMP's: the
library is linked against libgomp, which resolves to the copy torch has already loaded, so it
shares torch's thread pool (and `torch.set_num_threads`) instead of competing with it.

It is built into the cache (`$INFERGRID_CACHE_DIR`, else ~/.cache/infergrid) under a name that
holds the source's and flags' hash, at first use, in about a second, for the instruction set
torch reports: AVX-512 (strips of 32 columns) or AVX2 (16). `INFERGRID_CPU_KERNEL=avx2|off`
forces the AVX2 build or none (tests and benchmarks compare them). Where it cannot be built (no
AVX2, no C compiler, an ARM CPU), `available()` says why and the caller keeps its float path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Final

import torch

log = logging.getLogger("infergrid.engine")

SOURCE: Final = Path(__file__).with_suffix(".c")
GROUP: Final = 32  # int4 group size along the input
_FLAGS: Final = ("-O3", "-fopenmp", "-shared", "-fPIC", "-mavx2", "-mfma")
# Per torch's CPU capability: the instruction set to build for, and the strip width.
_TARGETS: Final = {
    "AVX2": ("-DWIDTH=8",),
    "AVX512": ("-DWIDTH=16", "-mavx512f", "-mavx512bw", "-mavx512vl"),
}


def cache_dir() -> Path:
    base = os.environ.get("INFERGRID_CACHE_DIR") or Path.home() / ".cache" / "infergrid"
    return Path(base) / "kernels"


ENV_VAR: Final = "INFERGRID_CPU_KERNEL"
CHOICES: Final = ("auto", "avx2", "off")


def target() -> str | None:
    """The build to use (a `_TARGETS` key), or None with the switch off or no AVX2."""
    choice = os.environ.get(ENV_VAR, "auto").strip().lower()
    if choice not in CHOICES:
        raise ValueError(f"{ENV_VAR}: {choice!r} is not one of {', '.join(CHOICES)}")
    capability = torch.backends.cpu.get_cpu_capability()
    if choice == "off" or capability not in _TARGETS:
        return None
    return "AVX2" if choice == "avx2" else capability


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The loaded kernel for `target()`, or why there is none: decided once per process
    (tests that change the switch clear this cache)."""
    chosen = target()
    if chosen is None:
        capability = torch.backends.cpu.get_cpu_capability()
        off = os.environ.get(ENV_VAR, "").strip().lower() == "off"
        return f"{ENV_VAR}=off" if off else f"the CPU has no AVX2 (torch reports {capability})"
    return _load(chosen)


@functools.cache
def _load(capability: str) -> ctypes.CDLL | str:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return "no C compiler (cc or gcc) to build it with"
    flags = (*_FLAGS, *_TARGETS[capability])
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    built = cache_dir() / f"cpu_quantized_matmul-{digest}.so"
    if not built.exists():
        error = _build(compiler, flags, built)
        if error:
            return error
    library = ctypes.CDLL(str(built))
    library.quantized_matmul_strip.restype = ctypes.c_int
    library.quantized_matmul.restype = ctypes.c_int
    library.quantized_matmul.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
    ]  # fmt: skip
    return library


def _build(compiler: str, flags: tuple[str, ...], target: Path) -> str | None:
    """Compile into a temporary file, then rename: concurrent engines never load half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        command = [compiler, *flags, str(SOURCE), "-o", str(partial)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}"
        partial.replace(target)
    return None


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
            f" {library.quantized_matmul_strip()}: pack them after choosing {ENV_VAR}"
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
