"""The programs of the binary images: our pause, compiled here static from
images/pause/pause.c, and the kube-scheduler the local cluster built from Go modules."""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

from .cluster_binaries import ensure_built, paths

HERE = Path(__file__).resolve().parent
PAUSE_SOURCE = HERE / "pause" / "pause.c"
PT_INTERP = 3


def is_static_elf(head: bytes) -> bool:
    """Whether an ELF executable asks for no dynamic loader (no PT_INTERP program header).
    `head` holds at least the ELF header and the program headers (the first 64 KiB do)."""
    if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    phoff, = struct.unpack_from("<Q", head, 0x20)  # fmt: skip
    phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
    for i in range(phnum):
        p_type, = struct.unpack_from("<I", head, phoff + i * phentsize)  # fmt: skip
        if p_type == PT_INTERP:
            return False
    return True


def check_static(path: Path) -> None:
    with path.open("rb") as f:
        if not is_static_elf(f.read(1 << 16)):
            raise RuntimeError(f"{path} is linked dynamically; an image of it alone cannot run it")


def build_pause(out_dir: Path, cc: str = "cc") -> Path:
    """Compiles pause.c static and stripped into `out_dir`; returns the binary."""
    if not shutil.which(cc):
        raise RuntimeError(f"{cc} not found: apt-get install gcc libc6-dev")
    out = out_dir / "pause"
    argv = [cc, "-static", "-Os", "-s", "-Wall", "-Wextra", "-Werror", "-o", str(out)]
    done = subprocess.run(argv + [str(PAUSE_SOURCE)], capture_output=True, text=True)
    if done.returncode:
        hint = " (the static C library is in libc6-dev)" if "-lc" in done.stderr else ""
        raise RuntimeError(f"compiling {PAUSE_SOURCE.name} failed{hint}:\n{done.stderr}")
    check_static(out)
    return out


def kube_scheduler(say: Callable[[str], None]) -> Path:
    """The local cluster's kube-scheduler; builds the cluster binaries when it is missing."""
    path = paths()["kube-scheduler"]
    if not path.exists():
        say("kube-scheduler: not built yet; building the cluster binaries (make cluster-build;")
        say("  cold: tens of minutes)")
        ensure_built()
    check_static(path)
    return path
