"""`make images`: every component image, built on this machine with no registry.

    python -m images.build [NAME ...] [--json]

Builds into one OCI image layout under the cache ($INFERGRID_CACHE/images/oci),
records name -> reference and manifest digest in images.json beside it, and prints a
table. Each image is named by a hash of its inputs, so a warm run builds nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from . import binaries, components, llama_server, lockfile, plan, record, runtime_only, tools
from .cluster_binaries import cache_dir
from .inputs import file_digest, files_digest, package_files
from .oci_layout import Layout
from .stages import StageRunner

ROOT = Path(__file__).resolve().parent.parent
NEEDED = ["umoci", "mmdebstrap", "chroot", "mount", "cc"]


def say(line: str) -> None:
    print(f"[images] {line}", file=sys.stderr, flush=True)


def images_home(cache: Path | None = None) -> Path:
    """Where the layout, the record, the wheelhouse and scratch space live."""
    if cache is not None:
        return cache
    return cache_dir() / "images"


def read_pyproject(root: Path = ROOT) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text())


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """One build at a time per cache: they share the layout and the scratch space."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def mount_points_under(mountinfo: str, folder: Path) -> list[str]:
    """Mount points inside `folder` (deepest first), from /proc/self/mountinfo's text."""
    prefix = str(folder).rstrip("/") + "/"
    points = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].encode().decode("unicode_escape")  # \040 for a space
            if point.startswith(prefix):
                points.append(point)
    return sorted(points, key=len, reverse=True)


def clear_scratch(work: Path) -> None:
    """Undoes what a killed build left: mounts first, then the files."""
    for point in mount_points_under(Path("/proc/self/mountinfo").read_text(), work):
        say(f"unmounting {point}, left by an earlier build")
        subprocess.run(["umount", "--lazy", point], check=False)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)


def read_locks(chosen: list[components.Image]) -> dict[str, str]:
    """The committed lock of every pip group the chosen images install, and pip's own."""
    names = {g.name for i in chosen if isinstance(i, components.PythonImage) for g in i.pip_groups}
    return {name: lockfile.read(name) for name in sorted(names | {"pip"}) if names}


def gather_inputs(
    chosen: list[components.Image], pyproject: dict, work: Path
) -> tuple[plan.Inputs, dict, dict[str, Path]]:
    """Source files and binaries of the chosen images, and their digests."""
    files, binary_paths = {}, {}
    for image in chosen:
        if isinstance(image, components.PythonImage):
            for package in image.packages:
                files.setdefault(package, package_files(ROOT, pyproject, package))
        elif image.binary == "pause":
            binary_paths["pause"] = binaries.build_pause(work)
        elif image.binary == "kube-scheduler":
            binary_paths["kube-scheduler"] = binaries.kube_scheduler(say)
        elif image.binary == "llama-server":
            binary_paths["llama-server"] = llama_server.llama_server(llama_server.IMAGE_FLAGS)
            binaries.check_static(binary_paths["llama-server"])
    inputs = plan.Inputs(
        sources={p: files_digest(f) for p, f in files.items()},
        binaries={b: file_digest(p) for b, p in binary_paths.items()},
        locks=read_locks(chosen),
    )
    return inputs, files, binary_paths


def build(
    names: Iterable[str] | None = None,
    *,
    cache: Path | None = None,
    progress: Callable[[str], None] = say,
) -> dict[str, record.BuiltImage]:
    """Builds the named images (all by default) unless already built; returns
    name -> BuiltImage (reference, tag, manifest digest, size, seconds built)."""
    pyproject = read_pyproject()
    table = components.images(pyproject)
    names = list(names or table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown image {', '.join(unknown)}; images: {', '.join(table)}")
    if os.geteuid() != 0:
        raise SystemExit("images are built as root (mmdebstrap, chroot and bind mounts need it)")
    tools.require(NEEDED, progress)
    home = images_home(cache)
    with locked(home / ".lock"):
        work = home / "work"
        clear_scratch(work)
        try:
            return _build_locked([table[n] for n in names], pyproject, home, work, progress)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _build_locked(chosen, pyproject, home, work, progress) -> dict[str, record.BuiltImage]:
    inputs, files, binary_paths = gather_inputs(chosen, pyproject, work)
    layout = Layout(home / "oci")
    layout.ensure()
    banned = runtime_only.forbidden(pyproject)
    runner = StageRunner(layout, home, files, binary_paths, banned, progress)
    built, keep = {}, set()
    for image in chosen:
        chain = plan.stages(image, inputs)
        tag = plan.image_tag(chain)
        final = plan.final_layout_tag(image.name, tag)
        keep |= {s.layout_tag for s in chain[:-1]} | {final}
        labels = {"org.opencontainers.image.title": f"infergrid/{image.name}"}
        seconds = runner.run(image, chain, final, labels)
        built[image.name] = record.BuiltImage(
            name=image.name,
            reference=plan.reference(image.name, tag),
            tag=tag,
            digest=layout.tags()[final]["digest"],
            size=layout.size(final),
            layout_tag=final,
            seconds=round(seconds, 1),
        )
        if seconds:
            progress(f"{image.name}: built {built[image.name].reference} in {seconds:.0f} s")
    record.update(home / record.RECORD, layout.path, built)
    if len(chosen) == len(components.images(pyproject)):
        prune(layout, home / "roots", keep, progress)
    return built


def prune(layout: Layout, roots: Path, keep: set[str], progress: Callable[[str], None]) -> None:
    """After a build of every image: drops the tags (and kept roots) no image uses now,
    then the blobs only they used."""
    stale = [t for t in layout.tags() if t not in keep]
    for tag in stale:
        layout.remove(tag)
    for root in roots.glob("*") if roots.exists() else []:
        if root.name not in keep:
            shutil.rmtree(root)
    if stale:
        freed = layout.gc()
        progress(f"pruned {len(stale)} stale tags, {record.human_size(freed)} of blobs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m images.build", description=__doc__.split("\n")[0]
    )
    parser.add_argument("names", nargs="*", help="images to build (default: all)")
    parser.add_argument("--json", action="store_true", help="print the record as JSON")
    parser.add_argument("--cache", type=Path, help="instead of $INFERGRID_CACHE/images")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so that mounts and scratch files are cleaned up.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        built = build(args.names, cache=args.cache)
    except (tools.ToolMissing, RuntimeError) as e:
        say(f"error: {e}")
        return 1
    if args.json:
        print(json.dumps({n: vars(b) for n, b in built.items()}, indent=2))
    else:
        print(record.table(list(built.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
