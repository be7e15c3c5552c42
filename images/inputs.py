"""What an image's content depends on, read from the working tree: the files of each
package it carries, and the digest of a binary. `images.plan` hashes these into keys."""

from __future__ import annotations

import hashlib
from pathlib import Path


def digest(*parts: str | bytes) -> str:
    """sha256 of the parts, each length-prefixed so that ("ab", "c") != ("a", "bc")."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def file_digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def wheel_packages(pyproject: dict) -> list[str]:
    """The wheel's packages, as paths from the repository root (hatchling's `packages`)."""
    return pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]


def package_dir(root: Path, pyproject: dict, package: str) -> Path:
    """Where a top-level package lives: the wheel's entry whose last part is its name
    (hatchling installs `operator/inference_operator` as `inference_operator`)."""
    paths = wheel_packages(pyproject)
    for path in paths:
        candidate = root / path
        if candidate.name == package and (candidate / "__init__.py").is_file():
            return candidate
    raise FileNotFoundError(f"package {package!r} is none of the wheel's {paths} under {root}")


def package_files(root: Path, pyproject: dict, package: str) -> list[tuple[str, Path]]:
    """(path inside site-packages, file) of what the wheel carries of one package: every
    file of its folder (the kubelet API's .proto beside its stubs), bytecode never."""
    top = package_dir(root, pyproject, package)
    found = []
    for path in sorted(top.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        found.append((f"{package}/{path.relative_to(top).as_posix()}", path))
    return found


def files_digest(files: list[tuple[str, Path]]) -> str:
    """One digest of names and contents: changes when a file is edited, added or renamed."""
    return digest(*(part for name, path in files for part in (name, file_digest(path))))
