"""An image as a chain of stages, each keyed by everything that decides its content.

A stage's key hashes its parent's key and its own inputs, so a changed input changes
its key and every key after it, and nothing before. Each stage is a tag in the OCI
layout: a stage whose tag is there is not built again. The last key names the image.
"""

from __future__ import annotations

from dataclasses import dataclass

from .components import (
    PIP,
    PYTHON,
    SUITE,
    BinaryImage,
    Image,
    LockedGroup,
    PipGroup,
    PythonImage,
    RunConfig,
)
from .inputs import digest

# Bump when how a stage is built changes (not what goes in): every key changes with it.
RECIPE = "1"
REPOSITORY = "docker.io/infergrid"  # how containerd and the kubelet name `infergrid/<name>`
TAG_HEX = 12


@dataclass(frozen=True)
class Stage:
    kind: str  # debian | pip (into the venv, in a chroot) | pip-target | app | binary | config
    key: str
    label: str  # for progress lines
    spec: object  # what it builds from: packages, a LockedGroup, the image, its RunConfig

    @property
    def layout_tag(self) -> str:
        return f"stage-{self.key[:24]}"


@dataclass(frozen=True)
class Inputs:
    """What the working tree says: digests of package sources and of binaries."""

    sources: dict[str, str]  # package -> files_digest
    binaries: dict[str, str]  # binary name -> sha256 of the file
    locks: dict[str, str]  # pip group (and "pip", the installer) -> its lock's text


def _run_key(parent: str, name: str, run: RunConfig) -> str:
    env = [f"{k}={v}" for k, v in run.env]
    return digest(
        parent, "config", name, *run.entrypoint, "--", *env, "--", run.user, run.workdir,
        *map(str, run.ports),
    )  # fmt: skip


def _pip_key(parent: str, kind: str, locked: LockedGroup) -> str:
    """The lock's text decides what is installed (pyproject's pins only through it)."""
    group = locked.group
    return digest(
        parent, kind, PIP, PYTHON, group.name, str(group.no_deps), locked.lock, locked.installer
    )


def _locked(group: PipGroup, inputs: Inputs) -> LockedGroup:
    for name in (group.name, "pip"):
        if name not in inputs.locks:
            raise KeyError(f"no lock for the pip group {name!r}: run python -m images.lock")
    return LockedGroup(group, inputs.locks[group.name], inputs.locks["pip"])


def stages(image: Image, inputs: Inputs) -> list[Stage]:
    """The chain that builds `image`, base first, its run config last."""
    if isinstance(image, BinaryImage):
        if image.binary not in inputs.binaries:
            raise KeyError(f"{image.name}: no digest for binary {image.binary!r}")
        dirs = [f"{d}:{mode:o}" for d, mode in image.dirs]
        key = digest(RECIPE, "binary", image.path, inputs.binaries[image.binary], *dirs)
        chain = [Stage("binary", key, f"adding {image.binary}", image)]
    else:
        chain = _python_stages(image, inputs)
    last = chain[-1].key
    run_key = _run_key(last, image.name, image.run)
    return chain + [Stage("config", run_key, "setting the config", image.run)]


def _python_stages(image: PythonImage, inputs: Inputs) -> list[Stage]:
    key = digest(RECIPE, "debian", SUITE, *sorted(image.debian_packages))
    chain = [Stage("debian", key, "making the Debian base", image.debian_packages)]
    for group in image.pip_groups:  # each lock holds only what the groups under it do not
        kind = "pip-target" if group.no_deps else "pip"
        locked = _locked(group, inputs)
        key = _pip_key(key, kind, locked)
        chain.append(Stage(kind, key, f"installing python {group.name}", locked))
    missing = [p for p in image.packages if p not in inputs.sources]
    if missing:
        raise KeyError(f"{image.name}: no source digest for {missing}")
    sources = [f"{p}={inputs.sources[p]}" for p in sorted(image.packages)]
    scripts = [f"{name}={target}" for name, target in image.scripts]
    key = digest(key, "app", PYTHON, *sources, "--", *scripts)
    chain.append(Stage("app", key, "adding the InferGrid packages", image))
    return chain


def image_tag(chain: list[Stage]) -> str:
    return chain[-1].key[:TAG_HEX]


def reference(name: str, tag: str) -> str:
    return f"{REPOSITORY}/{name}:{tag}"


def final_layout_tag(name: str, tag: str) -> str:
    return f"{name}-{tag}"
