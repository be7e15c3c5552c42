"""Each image is run before it is tagged: its check commands (the entrypoint's --help,
the engine's imports) in a chroot of its root, as its own user, with its own env.

A failing check leaves the image untagged, so the next build tries again. For a Python
image the root is the unpacked root of its last dependency layer, kept in the cache,
with the packages layer laid over it for the check and taken away after.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from .components import RunConfig
from .layers import Entry, with_parents


def lay(root: Path, entries: list[Entry], created: list[Path] | None = None) -> None:
    """Writes the entries into `root`, never over a path there; appends each path it
    creates to `created` as it goes, so a failure midway still says what to remove."""
    created = [] if created is None else created
    for e in with_parents(entries):
        path = root / e.path
        if e.data is None and e.link is None:
            if not path.exists():
                path.mkdir(mode=e.mode)
                created.append(path)
        elif e.link is not None and not path.is_symlink() and not path.exists():
            created.append(path)
            path.symlink_to(e.link)
        elif not path.exists():
            created.append(path)
            if isinstance(e.data, Path):
                shutil.copyfile(e.data, path)
            else:
                path.write_bytes(e.data)
            path.chmod(e.mode)
        else:
            raise FileExistsError(f"{e.path} is already in the root it is checked in")


@contextlib.contextmanager
def laid_over(root: Path, entries: list[Entry]) -> Iterator[None]:
    """Writes the entries into `root` for the duration; removes every path it created."""
    created: list[Path] = []
    try:
        lay(root, entries, created)
        yield
    finally:
        for path in reversed(created):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)


DEVICES = ("null", "zero", "full", "random", "urandom")
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"  # found here: the image's PATH may lack it


def _mount(*argv: str) -> None:
    subprocess.run(["mount", *argv], check=True, capture_output=True)


@contextlib.contextmanager
def runtime_mounts(root: Path) -> Iterator[None]:
    """What a container runtime gives every container and a chroot does not: the basic
    devices (torch reads /dev/urandom at import) and /proc. All undone after."""
    mounted: list[Path] = []
    created: list[Path] = []
    try:
        for sub in ("dev", "proc"):
            if not (root / sub).exists():
                (root / sub).mkdir()
                created.append(root / sub)
        for name in DEVICES:
            target = root / "dev" / name
            if not target.exists():
                target.touch()
                created.append(target)
            _mount("--bind", f"/dev/{name}", str(target))
            mounted.append(target)
        _mount("-t", "proc", "proc", str(root / "proc"))
        mounted.append(root / "proc")
        yield
    finally:
        for target in reversed(mounted):
            subprocess.run(["umount", str(target)], check=True)
        for path in reversed(created):
            path.rmdir() if path.is_dir() else path.unlink()


def run_checks(root: Path, run: RunConfig, checks: tuple[tuple[str, ...], ...], name: str) -> None:
    with runtime_mounts(root):
        _run_checks(root, run, checks, name)


def _run_checks(root: Path, run: RunConfig, checks: tuple[tuple[str, ...], ...], name: str):
    env = dict(run.env) or {"PATH": "/usr/bin:/bin"}
    for argv in checks:
        done = subprocess.run(
            [CHROOT, f"--userspec={run.user}", str(root), *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode:
            out = (done.stdout + done.stderr).strip()[-3000:]
            raise RuntimeError(f"{name}: check {' '.join(argv)} failed ({done.returncode}):\n{out}")
