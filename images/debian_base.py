"""A Debian root filesystem as one layer tar, made by mmdebstrap from the package archive.

The essential variant plus the packages asked for, merged /usr, no documentation,
manuals or translations (copyright files kept), a non-root user 65532 with a home, and
no apt configuration of this machine left behind. Mirrors and the apt options that
reach them (proxy, snapshot validity) come from this machine when it runs the same suite.
"""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

from .components import SUITE

DPKG_OPTIONS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/lintian/*",
)
# apt settings of this machine that decide whether the archive is reachable at all.
CARRIED_APT_OPTIONS = re.compile(
    r"^(Acquire::(https?::Proxy|Check-Valid-Until|Check-Date|Retries))(::\S+)? ", re.I
)
MERGED_USR_HOOKS = "/usr/share/mmdebstrap/hooks/merged-usr"
USER_HOOK = (
    "echo 'infergrid:x:65532:65532:infergrid:/home/infergrid:/usr/sbin/nologin'"
    ' >> "$1/etc/passwd"'
    " && echo 'infergrid:x:65532:' >> \"$1/etc/group\""
    ' && mkdir -p "$1/home/infergrid" && chown 65532:65532 "$1/home/infergrid"'
)
# mmdebstrap writes the options it was given into the root; they are this machine's.
CLEANUP_HOOK = 'rm -f "$1/etc/apt/apt.conf.d/99mmdebstrap" "$1/etc/dpkg/dpkg.cfg.d/99mmdebstrap"'


def carried_apt_options(apt_config_dump: str) -> list[str]:
    """The lines of `apt-config dump` worth passing on to mmdebstrap's apt."""
    return [
        line.rstrip(";").strip()
        for line in apt_config_dump.splitlines()
        if CARRIED_APT_OPTIONS.match(line)
    ]


def host_mirrors(os_release: str, sources: list[Path]) -> list[str]:
    """This machine's apt sources when it runs the suite the images use; else none, and
    mmdebstrap's default archive is used."""
    if f"VERSION_CODENAME={SUITE}" not in os_release.split():
        return []
    return [str(p) for p in sources]


def mmdebstrap_argv(
    packages: tuple[str, ...], out: Path, apt_options: list[str], mirrors: list[str]
) -> list[str]:
    argv = [
        "mmdebstrap",
        "--mode=root",
        "--variant=essential",
        "--include=" + ",".join(sorted(packages)),
        f"--hook-dir={MERGED_USR_HOOKS}",
        "--skip=output/dev",
    ]
    argv += [f"--dpkgopt={o}" for o in DPKG_OPTIONS]
    argv += [f"--aptopt={o}" for o in apt_options]
    argv += [f"--customize-hook={USER_HOOK}", f"--customize-hook={CLEANUP_HOOK}"]
    return argv + [SUITE, str(out), *mirrors]


def build_rootfs_tar(
    packages: tuple[str, ...], out: Path, log_file: Path, say: Callable[[str], None]
) -> None:
    """Writes the root filesystem to `out` (an uncompressed tar); mmdebstrap's output
    goes to `log_file`, and its tail into the error when it fails."""
    dump = subprocess.run(["apt-config", "dump"], capture_output=True, text=True).stdout
    os_release = Path("/etc/os-release").read_text() if Path("/etc/os-release").exists() else ""
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    if (
        Path("/etc/apt/sources.list").is_file()
        and Path("/etc/apt/sources.list").read_text().strip()
    ):
        sources.insert(0, Path("/etc/apt/sources.list"))
    argv = mmdebstrap_argv(
        packages, out, carried_apt_options(dump), host_mirrors(os_release, sources)
    )
    say(f"mmdebstrap {SUITE} with {', '.join(packages)} (cold: a minute or two)")
    # Its scratch root (and the mounts in it) under the build's scratch space, which the
    # next build clears should this one be killed.
    env = {**os.environ, "TMPDIR": str(out.parent)}
    with log_file.open("w") as log:
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        tail = log_file.read_text()[-2000:]
        raise RuntimeError(f"mmdebstrap failed (log: {log_file}):\n{tail}")
    _add_dev_dir(out)


def _add_dev_dir(tar: Path) -> None:
    """An empty /dev, where the runtime mounts its own (the device nodes are skipped)."""
    with tarfile.open(tar, "a", format=tarfile.PAX_FORMAT) as t:
        info = tarfile.TarInfo("./dev")
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        t.addfile(info)
