"""Where the local cluster's binaries live (etcd, Kubernetes, containerd, kwok, helm, built from
pinned Go modules), and building them on first use. Here, below both the image builder (whose
kube-scheduler image is the cluster's binary) and the local cluster, which uses both."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def cache_dir() -> Path:
    """The cache outside the repository that survives clones and checkouts."""
    return Path(os.environ.get("INFERGRID_CACHE", Path.home() / ".cache" / "infergrid"))


def versions() -> dict[str, str]:
    pins = {}
    for line in (HERE / "cluster-versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pins[key] = value
    return pins


def paths() -> dict[str, Path]:
    """Binary name to its path in the cache, keyed by pinned version."""
    v, bin_dir = versions(), cache_dir() / "bin"
    k8s = bin_dir / f"kubernetes-{v['K8S_VERSION']}"
    kwok = bin_dir / f"kwok-{v['KWOK_VERSION']}"
    containerd = bin_dir / f"containerd-{v['CONTAINERD_VERSION']}"
    return {
        "etcd": bin_dir / f"etcd-{v['ETCD_VERSION']}" / "etcd",
        "kube-apiserver": k8s / "kube-apiserver",
        "kube-controller-manager": k8s / "kube-controller-manager",
        "kube-scheduler": k8s / "kube-scheduler",
        "kubectl": k8s / "kubectl",
        "kubelet": k8s / "kubelet",
        "kwok": kwok / "kwok",
        "kwok-stages": kwok / "stages-lease.yaml",
        "containerd": containerd / "containerd",
        "containerd-shim-runc-v2": containerd / "containerd-shim-runc-v2",
        "ctr": containerd / "ctr",
        "helm": bin_dir / f"helm-{v['HELM_VERSION']}" / "helm",
    }


def ensure_built() -> dict[str, Path]:
    """Builds whatever is missing from the cache; a warm cache builds nothing."""
    found = paths()
    if not all(p.exists() for p in found.values()):
        subprocess.run(["bash", str(HERE / "build-cluster-binaries.sh")], check=True)
    return found
