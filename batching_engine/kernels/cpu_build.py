"""The engine's C kernels for the CPU: built once with the system's C compiler, called through
ctypes.

torch ships no fast path for what they do on an AVX2/AVX-512 CPU: weight-only int8/int4
matmuls (`cpu_quantized_matmul.c`), and a decode step's small per-layer work, which as torch
ops costs more in dispatch than in arithmetic (`cpu_decode.c`). Their threads are OpenMP's:
each library is linked against libgomp, which resolves to the copy torch has already loaded,
so they share torch's thread pool (and `torch.set_num_threads`) instead of competing with it.

Each source is built at first use, in about a second, into the cache (`$INFERGRID_CACHE_DIR`,
else ~/.cache/infergrid) under a name holding the hash of its text and flags, for one of
`TARGETS`: AVX-512 or AVX2, each with VNNI (integer dot products: the quantized matmul then
quantizes its activations to int8) or without. `auto` takes the first the CPU runs, in
`TARGETS`' order: torch's capability (AVX512 or AVX2) says which vector width, and the CPU's
flags (/proc/cpuinfo) whether it has VNNI, which torch's capability does not tell.
`INFERGRID_CPU_KERNEL=auto|avx512_vnni|avx512|avx2_vnni|avx2|off` forces one build, or none
(tests and benchmarks compare them). Where a library cannot be built (no AVX2, no C compiler,
an ARM CPU, a forced build the CPU cannot run) `load` says why, and its callers keep their
torch path.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import torch

ENV_VAR: Final = "INFERGRID_CPU_KERNEL"
# F16C (the float16 KV cache's conversions) comes with every AVX2 CPU.
_FLAGS: Final = ("-O3", "-fopenmp", "-shared", "-fPIC", "-mavx2", "-mfma", "-mf16c")
_AVX512: Final = ("-DWIDTH=16", "-mavx512f", "-mavx512bw", "-mavx512vl")


@dataclass(frozen=True, slots=True)
class Target:
    """A build: its compiler flags (WIDTH: floats a vector holds), and what the CPU needs to
    run it: torch's capability and, for VNNI, a /proc/cpuinfo flag."""

    flags: tuple[str, ...]
    capabilities: tuple[str, ...]
    cpu_flag: str | None = None


# `auto` takes the first the CPU runs; INFERGRID_CPU_KERNEL names one by its lower-cased key.
TARGETS: Final = {
    "AVX512_VNNI": Target((*_AVX512, "-mavx512vnni", "-DVNNI=1"), ("AVX512",), "avx512_vnni"),
    "AVX512": Target(_AVX512, ("AVX512",)),
    "AVX2_VNNI": Target(("-DWIDTH=8", "-mavxvnni", "-DVNNI=1"), ("AVX2", "AVX512"), "avx_vnni"),
    "AVX2": Target(("-DWIDTH=8",), ("AVX2", "AVX512")),
}
CHOICES: Final = ("auto", *(name.lower() for name in TARGETS), "off")
# Each VNNI build's float twin: same width, x multiplied as given (tests and bench compare).
FLOAT_TWIN: Final = {"AVX512_VNNI": "AVX512", "AVX2_VNNI": "AVX2"}


def cache_dir() -> Path:
    base = os.environ.get("INFERGRID_CACHE_DIR") or Path.home() / ".cache" / "infergrid"
    return Path(base) / "kernels"


def target() -> str | None:
    """The build to use (a `TARGETS` key), or None: switched off, or not one the CPU runs."""
    choice = _choice()
    if choice == "off":
        return None
    if choice != "auto":
        return choice.upper() if runs(choice.upper()) else None
    return next((name for name in TARGETS if runs(name)), None)


def runs(name: str) -> bool:
    """Whether this CPU runs build `name` (a `TARGETS` key)."""
    build = TARGETS[name]
    capability = torch.backends.cpu.get_cpu_capability()
    return capability in build.capabilities and (
        build.cpu_flag is None or build.cpu_flag in cpu_flags()
    )


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (none elsewhere: no VNNI build then)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def _choice() -> str:
    choice = os.environ.get(ENV_VAR, "auto").strip().lower()
    if choice not in CHOICES:
        raise ValueError(f"{ENV_VAR}: {choice!r} is not one of {', '.join(CHOICES)}")
    return choice


Declare = Callable[[ctypes.CDLL], None]


@functools.cache
def load(
    source: Path,
    declare: Declare,
    extra_flags: tuple[str, ...] = (),
    includes: tuple[Path, ...] = (),
) -> ctypes.CDLL | str:
    """`source` built for `target()`, loaded, and its functions' types set by `declare`; or why
    it cannot be. `includes`: the sources it `#include`s, whose text names the build too, so
    that editing one rebuilds it. Decided once per process: a dictionary lookup later."""
    chosen = target()
    if chosen is None:
        return _why_none()
    library = _load(source, (*_FLAGS, *TARGETS[chosen].flags, *extra_flags), includes)
    if not isinstance(library, str):
        declare(library)
    return library


def _why_none() -> str:
    choice, capability = _choice(), torch.backends.cpu.get_cpu_capability()
    if choice == "off":
        return f"{ENV_VAR}=off"
    if choice == "auto":
        return f"the CPU has no AVX2 (torch reports {capability})"
    build = TARGETS[choice.upper()]
    needs = " and ".join(filter(None, (build.capabilities[0], build.cpu_flag)))
    return f"{ENV_VAR}={choice} needs {needs}; torch reports {capability}"


def _load(source: Path, flags: tuple[str, ...], includes: tuple[Path, ...]) -> ctypes.CDLL | str:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return "no C compiler (cc or gcc) to build it with"
    text = b"".join(path.read_bytes() for path in (source, *includes))
    digest = hashlib.sha256(text + " ".join(flags).encode()).hexdigest()[:16]
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


@contextlib.contextmanager
def forced(choice: str) -> Iterator[None]:
    """Within the block, the libraries load afresh as `INFERGRID_CPU_KERNEL=choice` says, and
    as before after it: how tests and benchmarks compare builds in one process (weights packed
    inside the block are packed for its build)."""
    before = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = choice
    clear_cache()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = before
        clear_cache()


def clear_cache() -> None:
    """Forget what was loaded, so the next call re-reads the switch (tests change it)."""
    load.cache_clear()
