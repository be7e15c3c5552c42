"""The programs a build needs, installed from the Debian archive when they are missing."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable

# program -> the Debian packages that bring it
PACKAGES = {
    "umoci": ("umoci",),
    "mmdebstrap": ("mmdebstrap",),
    "chroot": ("coreutils",),
    "mount": ("mount",),
    "cc": ("gcc", "libc6-dev"),
    "ctr": ("containerd",),
    "cmake": ("cmake",),
    "ninja": ("ninja-build",),
    "c++": ("g++",),
    "prometheus": ("prometheus",),  # the local cluster's (e2e/cluster/prometheus.py)
    "chromium": ("chromium",),  # the report's page, opened headless in its test
}


class ToolMissing(RuntimeError):
    pass


def missing_message(programs: list[str]) -> str:
    return "; ".join(f"{p} not found: apt-get install {' '.join(PACKAGES[p])}" for p in programs)


def require(programs: list[str], say: Callable[[str], None]) -> None:
    """Installs the packages of missing programs with apt-get when running as root;
    otherwise, or when that fails, raises ToolMissing naming each and its package."""
    missing = [p for p in programs if not shutil.which(p)]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise ToolMissing(missing_message(missing))
    packages = sorted({pkg for p in missing for pkg in PACKAGES[p]})
    say(f"{', '.join(missing)} not found: apt-get install {' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    if subprocess.run(install, env=env).returncode:
        subprocess.run(["apt-get", "update", "-q"], env=env)
        subprocess.run(install, env=env)
    still = [p for p in missing if not shutil.which(p)]
    if still:
        raise ToolMissing(missing_message(still))
