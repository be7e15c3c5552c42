"""The pause program and the static-binary check."""

import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest

from images import binaries


def elf(interp: bool) -> bytes:
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x20, 64)  # program headers right after the header
    struct.pack_into("<HH", header, 0x36, 56, 2)
    loads = [struct.pack("<I", 1) + bytes(52), struct.pack("<I", 3 if interp else 4) + bytes(52)]
    return bytes(header) + b"".join(loads)


def test_is_static_elf():
    assert binaries.is_static_elf(elf(interp=False))
    assert not binaries.is_static_elf(elf(interp=True))
    with pytest.raises(ValueError):
        binaries.is_static_elf(b"#!/bin/sh\n")


def test_this_python_is_dynamic():
    import sys

    with open(sys.executable, "rb") as f:
        assert not binaries.is_static_elf(f.read(1 << 16))


needs_static_cc = pytest.mark.skipif(
    not shutil.which("cc") or not Path("/usr/lib/x86_64-linux-gnu/libc.a").exists(),
    reason="needs cc and the static C library (libc6-dev)",
)


@pytest.fixture(scope="module")
def pause(tmp_path_factory) -> Path:
    return binaries.build_pause(tmp_path_factory.mktemp("pause"))


@needs_static_cc
def test_pause_is_static_and_answers_v(pause):
    binaries.check_static(pause)
    done = subprocess.run([str(pause), "-v"], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0 and done.stdout.startswith("infergrid-pause")


@needs_static_cc
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_pause_exits_0_on_a_stop_signal(pause, sig):
    proc = subprocess.Popen([str(pause)], stderr=subprocess.PIPE, text=True)
    time.sleep(0.2)
    assert proc.poll() is None  # it sleeps
    proc.send_signal(sig)
    assert proc.wait(timeout=10) == 0
    assert f"signal {int(sig)}" in proc.stderr.read()
