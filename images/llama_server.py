"""llama.cpp's `llama-server`, built here from the sources that the llama-cpp-python sdist
vendors: the program of the `llama-cpp` image (the `llama.cpp` runtime) and of the engine's
bench against llama.cpp.

The sdist is pinned by version and sha256, the build by its CMake flags: each set of flags
builds once into its own folder under the cache, and a later call finds the binary there.
The image's build is static (an image of the program alone runs it) and portable: x86-64
with AVX2 and FMA, not `GGML_NATIVE`, which compiles for whatever this machine advertises
(and crashes on a VM that advertises AMX without running it).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from . import tools
from .cluster_binaries import cache_dir

LLAMA_CPP_PYTHON: Final = "0.3.36"
SDIST_SHA256: Final = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_COMMON: Final = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
)
# The image's: every library linked in, instructions any AVX2 machine runs. No OpenMP (only
# a shared libgomp is installed; ggml's own thread pool serves) and no OpenSSL (it serves
# plain HTTP in the pod and loads its model from a file).
IMAGE_FLAGS: Final = (
    *_COMMON,
    "-DGGML_NATIVE=OFF",
    "-DGGML_OPENMP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DCMAKE_EXE_LINKER_FLAGS=-static",
)
# The bench's: the instructions this machine runs, named one by one. Not `GGML_NATIVE`: a VM
# may advertise AMX and fault on its first AMX instruction, and this one does.
BENCH_FLAGS: Final = (
    *_COMMON,
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX512=ON",
    "-DGGML_AVX512_VBMI=ON",
    "-DGGML_AVX512_VNNI=ON",
    "-DGGML_AVX512_BF16=ON",
    "-DGGML_AVX_VNNI=ON",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
)


def _say(line: str) -> None:
    print(f"llama.cpp: {line}", file=sys.stderr, flush=True)


def build_root(flags: tuple[str, ...]) -> Path:
    """Where one set of flags builds: the sdist's version and a digest of the flags."""
    key = hashlib.sha256("\0".join(flags).encode()).hexdigest()[:12]
    return cache_dir() / "llama.cpp" / f"{LLAMA_CPP_PYTHON}-{key}"


def llama_server(flags: tuple[str, ...], say: Callable[[str], None] = _say) -> Path:
    """The llama-server these flags build: found in the cache, else built (minutes)."""
    return program("llama-server", flags, say)


def program(target: str, flags: tuple[str, ...], say: Callable[[str], None] = _say) -> Path:
    """One of llama.cpp's programs (`llama-server`, `llama-quantize`) built with these flags:
    found in the cache, else built, in the same build folder as the others."""
    root = build_root(flags)
    binary = root / "build" / "bin" / target
    if not binary.exists():
        _build(root, flags, target, say)
    return binary


def _build(root: Path, flags: tuple[str, ...], target: str, say: Callable[[str], None]) -> None:
    """Download and check the sdist, unpack its vendored llama.cpp, configure and build."""
    tools.require(["cmake", "ninja", "c++"], say)
    root.mkdir(parents=True, exist_ok=True)
    source = root / "src"
    if not (source / "CMakeLists.txt").exists():
        _unpack(_sdist(root, say), source)
    if not (root / "build" / "build.ninja").exists():
        _step(say, "configuring", ["cmake", "-S", str(source), "-B", str(root / "build"),
                                   "-G", "Ninja", *flags])  # fmt: skip
    jobs = str(os.cpu_count() or 1)
    _step(say, f"building {target} with {jobs} jobs (several minutes)",
          ["cmake", "--build", str(root / "build"), "--target", target, "-j", jobs])  # fmt: skip


def _sdist(root: Path, say: Callable[[str], None]) -> Path:
    """The pinned sdist, downloaded by pip from the package index, its sha256 checked."""
    folder = root / "sdist"
    _step(say, f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON} sdist",
          [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
           f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(folder)])  # fmt: skip
    (archive,) = folder.glob("llama_cpp_python-*.tar.gz")
    with archive.open("rb") as f:
        found = hashlib.file_digest(f, "sha256").hexdigest()
    if found != SDIST_SHA256:
        archive.unlink()
        raise RuntimeError(f"{archive.name}: sha256 {found}, pinned {SDIST_SHA256}")
    return archive


def _unpack(archive: Path, source: Path) -> None:
    with tempfile.TemporaryDirectory(dir=source.parent) as tmp, tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
        (top,) = Path(tmp).iterdir()
        shutil.rmtree(source, ignore_errors=True)
        (top / "vendor" / "llama.cpp").rename(source)


def _step(say: Callable[[str], None], what: str, command: list[str]) -> None:
    say(what)
    started = time.monotonic()
    subprocess.run(command, check=True, stdout=sys.stderr)
    say(f"done in {time.monotonic() - started:.0f} s")
