"""What changed in an unpacked root between two moments, as the entries of a layer.

Two snapshots of the root's metadata (lstat of every path outside the masked ones)
are compared: a path that is new or whose type, size, mode, owner, mtime or link target
changed goes into the layer with its content; a path that went away becomes a whiteout
(`.wh.<name>`), once, at the top of what went away. No file is read to compare, so a
6 GB root is walked in seconds.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .layers import Entry


@dataclass(frozen=True)
class PathState:
    kind: str  # file | dir | link
    mode: int
    uid: int
    gid: int
    size: int
    mtime_ns: int
    link: str | None


def _state(path: Path) -> PathState:
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        kind, link = "link", os.readlink(path)
    elif stat.S_ISDIR(st.st_mode):
        kind, link = "dir", None
    elif stat.S_ISREG(st.st_mode):
        kind, link = "file", None
    else:
        raise ValueError(f"{path}: only files, directories and links go into a layer")
    size = st.st_size if kind == "file" else 0
    mode = stat.S_IMODE(st.st_mode)
    return PathState(kind, mode, st.st_uid, st.st_gid, size, st.st_mtime_ns, link)


def masked(path: str, masks: list[str]) -> bool:
    return any(path == m.strip("/") or path.startswith(m.strip("/") + "/") for m in masks)


def snapshot(root: Path, masks: list[str]) -> dict[str, PathState]:
    """Path (relative, posix) -> its metadata, for every path under `root` not masked."""
    found = {}
    for top, dirs, files in os.walk(root):
        rel_top = Path(top).relative_to(root).as_posix()
        prefix = "" if rel_top == "." else rel_top + "/"
        dirs[:] = [d for d in dirs if not masked(prefix + d, masks)]
        for name in dirs + files:
            rel = prefix + name
            if not masked(rel, masks):
                found[rel] = _state(Path(top) / name)
    return found


def changes(
    before: dict[str, PathState], after: dict[str, PathState]
) -> tuple[list[str], list[str]]:
    """(paths new or changed, paths removed at the top of what went away), both sorted."""
    changed = sorted(p for p, s in after.items() if before.get(p) != s)
    gone = set(before) - set(after)
    removed = sorted(p for p in gone if str(PurePosixPath(p).parent) not in gone)
    return changed, removed


def whiteout(path: str) -> str:
    p = PurePosixPath(path)
    return str(p.parent / f".wh.{p.name}") if str(p.parent) != "." else f".wh.{p.name}"


def layer_entries(
    root: Path, changed: list[str], removed: list[str], after: dict[str, PathState]
) -> list[Entry]:
    entries = []
    for rel in changed:
        s = after[rel]
        data = None if s.kind == "dir" else (b"" if s.kind == "link" else root / rel)
        entries.append(Entry(rel, data, s.mode, s.mtime_ns // 10**9, s.link, s.uid, s.gid))
    for rel in removed:
        entries.append(Entry(whiteout(rel), b"", 0o644))
    return entries
