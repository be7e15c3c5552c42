"""The engine's C kernels for the CPU: built once with the system's C compiler, called through
ctypes.

torch ships no fast path for what they do on an AVX2/AVX-512 CPU: weight-only int8/int4
matmuls (`cpu_quantized_matmul.c`), and a decode step's small per-layer work, which as torch
ops costs more in dispatch than in arithmetic (`cpu_decode.c`). Their threads are OpenMP's:
each library is linked against libgomp, which resolves to the copy torch has already loaded,
so they share torch's thread pool (and `torch.set_num_threads`) instead of competing with it.

Each source is built at first use, in about a second, into the cache (`$INFERGRID_CACHE_DIR`,
else ~/.cache/infergrid) under a name holding the hash of its text and flags, for the
instruction set torch reports: AVX-512 or AVX2. `INFERGRID_CPU_KERNEL=auto|avx2|off` forces
the AVX2 build, or none (tests and benchmarks compare them). Where a library cannot be built
(no AVX2, no C compiler, an ARM CPU) `load` says why, and its callers keep their torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Final

import torch

ENV_VAR: Final = "INFERGRID_CPU_KERNEL"
CHOICES: Final = ("auto", "avx2", "off")
_FLAGS: Final = ("-O3", "-fopenmp", "-shared", "-fPIC", "-mavx2", "-mfma")
# Per torch's CPU capability: the instruction set to build for, and its vector width in floats.
TARGETS: Final = {
    "AVX2": ("-DWIDTH=8",),
    "AVX512": ("-DWIDTH=16", "-mavx512f", "-mavx512bw", "-mavx512vl"),
}


def cache_dir() -> Path:
    base = os.environ.get("INFERGRID_CACHE_DIR") or Path.home() / ".cache" / "infergrid"
    return Path(base) / "kernels"


def target() -> str | None:
    """The build to use (a `TARGETS` key), or None with the switch off or no AVX2."""
    choice = os.environ.get(ENV_VAR, "auto").strip().lower()
    if choice not in CHOICES:
        raise ValueError(f"{ENV_VAR}: {choice!r} is not one of {', '.join(CHOICES)}")
    capability = torch.backends.cpu.get_cpu_capability()
    if choice == "off" or capability not in TARGETS:
        return None
    return "AVX2" if choice == "avx2" else capability


Declare = Callable[[ctypes.CDLL], None]


@functools.cache
def load(source: Path, declare: Declare, extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL | str:
    """`source` built for `target()`, loaded, and its functions' types set by `declare`; or why
    it cannot be. Decided once per process: a dictionary lookup on every later call."""
    chosen = target()
    if chosen is None:
        if os.environ.get(ENV_VAR, "").strip().lower() == "off":
            return f"{ENV_VAR}=off"
        return f"the CPU has no AVX2 (torch reports {torch.backends.cpu.get_cpu_capability()})"
    library = _load(source, (*_FLAGS, *TARGETS[chosen], *extra_flags))
    if not isinstance(library, str):
        declare(library)
    return library


def _load(source: Path, flags: tuple[str, ...]) -> ctypes.CDLL | str:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return "no C compiler (cc or gcc) to build it with"
    digest = hashlib.sha256(source.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    built = cache_dir() / f"{source.stem}-{digest}.so"
    if not built.exists():
        error = _build(compiler, source, flags, built)
        if error:
            return error
    return ctypes.CDLL(str(built))


def _build(compiler: str, source: Path, flags: tuple[str, ...], target: Path) -> str | None:
    """Compile into a temporary file, then rename: concurrent engines never load half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        command = [compiler, *flags, str(source), "-o", str(partial)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}"
        partial.replace(target)
    return None


def clear_cache() -> None:
    """Forget what was loaded, so the next call re-reads the switch (tests change it)."""
    load.cache_clear()
