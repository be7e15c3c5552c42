"""What an image's content depends on, read from the working tree: the files of each
package it carries, and the digest of a binary. `images.plan` hashes these into keys."""

from __future__ import annotations

import fnmatch
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


def package_dir(root: Path, pyproject: dict, package: str) -> Path:
    """Where a top-level package lives: the `where` folders of setuptools' package finder."""
    wheres = pyproject["tool"]["setuptools"]["packages"]["find"].get("where", ["."])
    for where in wheres:
        candidate = root / where / package
        if (candidate / "__init__.py").is_file():
            return candidate
    raise FileNotFoundError(f"package {package!r} is in none of {wheres} under {root}")


def package_files(root: Path, pyproject: dict, package: str) -> list[tuple[str, Path]]:
    """(path inside site-packages, file) of what a wheel would carry of one package: its
    .py files and the package-data patterns of pyproject.toml; never __pycache__."""
    top = package_dir(root, pyproject, package)
    data = pyproject["tool"]["setuptools"].get("package-data", {}).get(package, [])
    found = []
    for path in sorted(top.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(top).as_posix()
        if path.suffix == ".py" or any(fnmatch.fnmatch(rel, p) for p in data):
            found.append((f"{package}/{rel}", path))
    return found


def files_digest(files: list[tuple[str, Path]]) -> str:
    """One digest of names and contents: changes when a file is edited, added or renamed."""
    return digest(*(part for name, path in files for part in (name, file_digest(path))))
