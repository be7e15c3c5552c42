"""HAMi's scheduler extender, built once from a checkout of its public repository into the cache.

The Go module proxy does not serve HAMi's own module, but its repository builds here: ``go build
./cmd/scheduler`` in a checkout fetches its dependencies from the proxy. The binary is cached
under the commit it was built from (``<cache>/bin/hami-<commit>/scheduler``, beside the local
cluster's binaries, see ``images/cluster_binaries.py``), so a second run builds nothing.

The figures in docs/placement.md are of ``PINNED_COMMIT``; a checkout at another commit is refused
unless ``--hami-commit`` names it, so a table never says one commit and measures another.

    git clone https://github.com/Project-HAMi/HAMi DIR && git -C DIR checkout PINNED_COMMIT
    .venv/bin/python -m bench.hami_build --hami-src DIR [--hami-commit COMMIT]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from images.cluster_binaries import cache_dir

PINNED_COMMIT = "4707fb02c91c545bc7343ce26dba4c32919f9a3e"
"""The HAMi commit docs/placement.md's table measured (2026-12, `chore: bump golang.org/x/mod`)."""


class HamiSourceError(ValueError):
    """--hami-src does not name a git checkout of HAMi at the commit asked for."""


def commit_of(src: Path) -> str:
    """The full commit the checkout at ``src`` stands on: what the cache is keyed by."""
    if not (src / "cmd" / "scheduler").is_dir():
        raise HamiSourceError(f"--hami-src {src}: no cmd/scheduler; not a checkout of HAMi")
    found = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"],
                           capture_output=True, text=True)  # fmt: skip
    if found.returncode != 0:
        raise HamiSourceError(f"--hami-src {src}: not a git checkout ({found.stderr.strip()})")
    return found.stdout.strip()


def binary_path(commit: str) -> Path:
    """Where the scheduler built from ``commit`` lives in the cache."""
    return cache_dir() / "bin" / f"hami-{commit}" / "scheduler"


def ensure_built(src: Path, wanted: str = PINNED_COMMIT) -> tuple[Path, str]:
    """The scheduler binary for the checkout's commit, built on first use; and the commit,
    which must be ``wanted``."""
    commit = commit_of(src)
    if commit != wanted:
        raise HamiSourceError(
            f"--hami-src {src} is at {commit[:12]}, not {wanted[:12]}: check out that commit"
            f" (git -C {src} checkout {wanted}), or name this one with --hami-commit"
        )
    out = binary_path(commit)
    if out.exists():
        return out, commit
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    # cgo stays on: HAMi's NVML binding needs it; its deprecation warnings are not ours to read.
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod",
           "CGO_CFLAGS": "-O2 -Wno-deprecated-declarations"}  # fmt: skip
    print(f"building HAMi's scheduler at {commit[:12]} (first run only)", file=sys.stderr)
    subprocess.run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(tmp),
                    "./cmd/scheduler"], cwd=src, env=env, check=True)  # fmt: skip
    tmp.rename(out)
    return out, commit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hami-src", type=Path, required=True, help="a git checkout of HAMi")
    parser.add_argument("--hami-commit", default=PINNED_COMMIT, help="the commit it must be at")
    args = parser.parse_args()
    try:
        path, commit = ensure_built(args.hami_src, args.hami_commit)
    except HamiSourceError as err:
        parser.error(str(err))
    print(f"{path} ({commit})")


if __name__ == "__main__":
    main()
