"""Layer tars written here, byte for byte the same for the same input: owned by root,
mtime 0, sorted, parents first. The InferGrid packages and console scripts of a Python
image are one such layer; each binary image is another."""

from __future__ import annotations

import io
import py_compile
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from .components import PYTHON, SITE_PACKAGES, VENV, PythonImage


@dataclass(frozen=True)
class Entry:
    path: str  # inside the image, without a leading slash
    data: bytes | Path | None  # the content, or a file holding it; None: a directory
    mode: int
    mtime: int = 0
    link: str | None = None  # a symbolic link to this target (data is ignored)
    uid: int = 0
    gid: int = 0


def console_script(target: str) -> bytes:
    """The script pip would write for `module:function`, run by the venv's python."""
    module, _, function = target.partition(":")
    if not module or not function:
        raise ValueError(f"console script target {target!r} is not module:function")
    return (
        f"#!{VENV}/bin/python\nimport sys\nfrom {module} import {function}\n\n"
        f'if __name__ == "__main__":\n    sys.exit({function}())\n'
    ).encode()


def cache_file(module_path: str) -> str | None:
    """Where Python looks for the compiled module of a .py, when this interpreter is the
    image's Python version (else None: the image compiles it at import)."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" != PYTHON:
        return None
    p = PurePosixPath(module_path)
    return str(p.parent / "__pycache__" / f"{p.stem}.{sys.implementation.cache_tag}.pyc")


def compiled(source: Path, image_path: str) -> bytes:
    """Bytecode that never checks the source's mtime (unchecked-hash pyc): valid on a
    read-only root whatever the layer's mtimes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.pyc"
        mode = py_compile.PycInvalidationMode.UNCHECKED_HASH
        py_compile.compile(str(source), str(out), image_path, doraise=True, invalidation_mode=mode)
        return out.read_bytes()


def app_entries(image: PythonImage, files: dict[str, list[tuple[str, Path]]]) -> list[Entry]:
    """The carried packages (`files`: package -> (path in site-packages, file)), their
    bytecode, and the image's console scripts."""
    entries = []
    for package in image.packages:
        for rel, path in files[package]:
            image_path = f"{SITE_PACKAGES}/{rel}"
            entries.append(Entry(image_path.lstrip("/"), path.read_bytes(), 0o644))
            pyc = cache_file(image_path) if rel.endswith(".py") else None
            if pyc:
                entries.append(Entry(pyc.lstrip("/"), compiled(path, image_path), 0o644))
    for name, target in image.scripts:
        entries.append(Entry(f"{VENV}/bin/{name}".lstrip("/"), console_script(target), 0o755))
    return entries


def target_entries(staging: Path) -> list[Entry]:
    """What `pip install --target` put in `staging`, under site-packages, with bytecode.
    Console scripts (`bin/`, e.g. a model package's CLI) are left out: pip wrote them for
    this machine's Python, and the image runs only its own entry points."""
    entries = []
    for path in sorted(staging.rglob("*")):
        top = path.relative_to(staging).parts[0]
        if path.is_dir() or "__pycache__" in path.parts or top == "bin":
            continue
        image_path = f"{SITE_PACKAGES}/{path.relative_to(staging).as_posix()}"
        mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
        entries.append(Entry(image_path.lstrip("/"), path, mode))
        pyc = cache_file(image_path) if path.suffix == ".py" else None
        if pyc:
            entries.append(Entry(pyc.lstrip("/"), compiled(path, image_path), 0o644))
    return entries


def with_parents(entries: list[Entry]) -> list[Entry]:
    """Adds a 0755 directory entry for every parent not listed, and sorts by path."""
    listed = {e.path for e in entries}
    extra = {}
    for e in entries:
        for parent in PurePosixPath(e.path).parents:
            p = str(parent)
            if p != "." and p not in listed:
                extra[p] = Entry(p, None, 0o755)
    return sorted([*entries, *extra.values()], key=lambda e: e.path)


def write_tar(out: Path | BinaryIO, entries: list[Entry], add_parents: bool = True) -> None:
    """The entries (and, with add_parents, every parent directory) sorted by path, into a
    file or a stream."""
    listed = with_parents(entries) if add_parents else sorted(entries, key=lambda e: e.path)
    if isinstance(out, Path):
        tar = tarfile.open(out, "w", format=tarfile.PAX_FORMAT)
    else:
        tar = tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT)
    with tar:
        for e in listed:
            info = tarfile.TarInfo(e.path)
            info.mode, info.mtime, info.uid, info.gid = e.mode, e.mtime, e.uid, e.gid
            if e.link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, e.link
                tar.addfile(info)
            elif e.data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(e.data, Path):
                info.size = e.data.stat().st_size
                with e.data.open("rb") as f:
                    tar.addfile(info, f)
            else:
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
