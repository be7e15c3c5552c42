"""No build- or test-only packages in an image: what installs, builds or tests code has
no business in a running pod (it is more code to exploit, and pip would let a shell in
the pod install more). The locks are checked (`python -m images.lock --check`) and so is
every built image's /opt/infergrid, before it is tagged.
"""

from __future__ import annotations

from pathlib import Path

from .lockfile import canonical, requirement_pin

# Installers and build backends; grpcio-tools generates the kubelet stubs (make protos).
BUILD_ONLY = frozenset(
    {"pip", "setuptools", "wheel", "build", "hatchling", "grpcio-tools", "cython", "uv"}
)


def forbidden(pyproject: dict) -> frozenset[str]:
    """The build tools, and every package of pyproject.toml's `test` extra."""
    test = pyproject["project"].get("optional-dependencies", {}).get("test", [])
    return BUILD_ONLY | {requirement_pin(r)[0] for r in test}


def present(names: list[str], banned: frozenset[str]) -> list[str]:
    """The banned ones among `names`, canonical and sorted."""
    return sorted({canonical(n) for n in names} & banned)


def refuse(names: list[str], banned: frozenset[str], where: str) -> None:
    """Raises naming the banned packages found in `where`."""
    found = present(names, banned)
    if found:
        raise ValueError(f"{where} holds build- or test-only packages: {', '.join(found)}")


def installed(site_packages: Path) -> list[str]:
    """The distributions in a site-packages folder, from their .dist-info folders."""
    if not site_packages.is_dir():
        return []
    return sorted(
        d.name.removesuffix(".dist-info").rpartition("-")[0]
        for d in site_packages.iterdir()
        if d.name.endswith(".dist-info")
    )
