"""What a real node needs from the machine, and installing it from Debian's packages.

The kubelet and containerd 2 (with its runc shim and ctr) are built from the pinned Go modules
like the control plane: Debian's containerd 1.6 has no CDI, which DRA needs. runc and the CNI
plugins come from the distribution, installed on first use. A machine that lacks one and cannot
install it gets an error naming the package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .node_configs import CNI_BIN_DIR
from .processes import ClusterError


@dataclass(frozen=True, slots=True)
class Requirement:
    what: str
    path: str  # a command on PATH, or an absolute file
    package: str  # the Debian package that provides it

    def present(self) -> bool:
        if self.path.startswith("/"):
            return Path(self.path).exists()
        return shutil.which(self.path) is not None


CNI_PACKAGE = "containernetworking-plugins"
REQUIREMENTS = (
    Requirement("runc", "runc", "runc"),
    Requirement("the CNI bridge plugin", str(CNI_BIN_DIR / "bridge"), CNI_PACKAGE),
    Requirement("the CNI host-local IPAM", str(CNI_BIN_DIR / "host-local"), CNI_PACKAGE),
    Requirement("the CNI loopback plugin", str(CNI_BIN_DIR / "loopback"), CNI_PACKAGE),
    Requirement("iptables", "iptables", "iptables"),
    Requirement("ip", "ip", "iproute2"),
    Requirement("nsenter", "nsenter", "util-linux"),
)  # fmt: skip


def missing() -> list[Requirement]:
    return [r for r in REQUIREMENTS if not r.present()]


def ensure() -> None:
    """Installs what is missing with apt-get (as root), or says what to install."""
    absent = missing()
    if not absent:
        return
    packages = sorted({r.package for r in absent})
    need = ", ".join(f"{r.what} ({r.package})" for r in absent)
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise ClusterError(
            f"a real node needs {need}; install them: apt-get install {' '.join(packages)}"
        )
    print(f"[real node] installing {' '.join(packages)} from Debian (first run)", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
    ):
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode:
            raise ClusterError(
                f"a real node needs {need}, and `{' '.join(argv)}` failed:\n{done.stderr[-2000:]}"
            )
    if still := missing():
        raise ClusterError(f"still missing after apt-get: {', '.join(r.what for r in still)}")


def check_machine() -> None:
    """What a kubelet needs of the machine itself, with what to do about each."""
    if os.geteuid() != 0:
        raise ClusterError("a real node runs a kubelet and containerd, which need root")
    if not Path("/sys/fs/cgroup").is_dir():
        raise ClusterError("a real node needs cgroups mounted at /sys/fs/cgroup")
