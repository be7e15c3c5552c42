"""Imports built images into a containerd: what a real node's setup calls.

The images go in as one OCI archive streamed to `ctr images import -`. Its index.json
lists only the images asked for, each named by the `io.containerd.image.name`
annotation (the name the kubelet asks for), and it carries only the blobs containerd
does not hold yet. An image containerd already has under its name with the same
manifest digest is not imported again.

With --prune, our images of earlier builds go first, so a node's store holds one build.

    python -m images.containerd_load --address SOCKET [--prune] [NAME ...]
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from . import record
from .oci_layout import Layout

CONTAINERD_NAME = "io.containerd.image.name"
REF_NAME = "org.opencontainers.image.ref.name"
DEFAULT_ADDRESS = "/run/containerd/containerd.sock"
REPOSITORY = "docker.io/infergrid/"
ID_PREFIX = "sha256:"  # the kubelet names each image it has used by its ID too


class LoadError(RuntimeError):
    pass


def archive_index(entries: list[tuple[dict, str, dict]]) -> dict:
    """index.json of the archive from (manifest descriptor, full reference, platform)."""
    manifests = []
    for desc, reference, platform in entries:
        tag = reference.rsplit(":", 1)[1]
        manifests.append(
            {
                "mediaType": desc["mediaType"],
                "digest": desc["digest"],
                "size": desc["size"],
                "platform": platform,
                "annotations": {CONTAINERD_NAME: reference, REF_NAME: tag},
            }
        )
    return {"schemaVersion": 2, "manifests": manifests}


def parse_images(ctr_images_ls: str) -> dict[str, str]:
    """Reference -> manifest digest, from `ctr images ls` (REF TYPE DIGEST ...)."""
    found = {}
    for line in ctr_images_ls.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3 and fields[2].startswith("sha256:"):
            found[fields[0]] = fields[2]
    return found


def to_import(wanted: dict[str, dict], present: dict[str, str]) -> list[str]:
    """Names of the wanted images (name -> record entry) containerd lacks as built."""
    return [n for n, e in wanted.items() if present.get(e["reference"]) != e["digest"]]


def stale(built: dict[str, dict], present: dict[str, str]) -> list[str]:
    """References containerd holds for our images of earlier builds: they keep gigabytes of
    layers and unpacked snapshots alive. That is every `docker.io/infergrid/` name not naming
    an image of the current build as built, and the kubelet's `sha256:<id>` aliases of those
    images, or of images no name holds any longer. Other repositories' images are never
    touched."""
    current = {e["reference"]: e["digest"] for e in built.values()}
    names = {ref: d for ref, d in present.items() if not ref.startswith(ID_PREFIX)}
    old = {ref for ref, d in names.items() if ref.startswith(REPOSITORY) and current.get(ref) != d}
    held = {d for ref, d in names.items() if ref not in old}
    aliases = {ref for ref, d in present.items() if ref.startswith(ID_PREFIX) and d not in held}
    return sorted(old | aliases)


def _ctr(ctr_binary: str, address: str, namespace: str) -> list[str]:
    return [ctr_binary, "--address", address, "--namespace", namespace]


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    except FileNotFoundError as e:
        raise LoadError(f"{argv[0]} not found: apt-get install containerd") from e
    if done.returncode:
        raise LoadError(f"{' '.join(argv)} failed: {done.stderr.strip()[-1500:]}")
    return done.stdout


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def _stream(argv: list[str], layout: Layout, index: dict, blobs: list[dict]) -> None:
    """Writes the archive into `ctr images import -` as it reads it."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=out)
        try:
            with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                _add_bytes(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
                _add_bytes(tar, "index.json", json.dumps(index).encode())
                for desc in blobs:
                    hex_digest = desc["digest"].split(":", 1)[1]
                    tar.add(layout.blob(desc["digest"]), arcname=f"blobs/sha256/{hex_digest}")
            proc.stdin.close()
        except BrokenPipeError:
            pass  # ctr stopped reading: its exit status and output say why
        rc = proc.wait()
        out.seek(0)
        if rc:
            raise LoadError(f"{' '.join(argv)} failed ({rc}): {out.read().strip()[-1500:]}")


def load(
    names: Iterable[str] | None = None,
    *,
    ctr_binary: str = "ctr",
    address: str | Path = DEFAULT_ADDRESS,
    namespace: str = "k8s.io",
    snapshotter: str | None = None,
    cache: Path | None = None,
    progress: Callable[[str], None] | None = None,
    prune: bool = False,
) -> dict[str, str]:
    """Imports the named built images (all by default) into the containerd at `address`;
    returns name -> reference for every one asked for, imported now or already there.
    With `prune`, first removes our images of earlier builds (see `stale`) and waits for
    containerd to free their content. Raises LoadError when an image was never built or ctr
    fails."""
    from .build import images_home, say

    progress = progress or say
    home = images_home(cache)
    built = record.read(home / record.RECORD)
    names = list(names or built["images"])
    missing = [n for n in names if n not in built["images"]]
    if missing:
        raise LoadError(f"not built: {', '.join(missing)} (make images)")
    wanted = {n: built["images"][n] for n in names}
    ctr = _ctr(ctr_binary, str(address), namespace)
    present = parse_images(_run([*ctr, "images", "ls"]))
    old = stale(built["images"], present) if prune else []
    if old:
        progress(f"removing {len(old)} image(s) of earlier builds from containerd")
        _run([*ctr, "images", "rm", "--sync", *old])
    todo = to_import(wanted, present)
    if todo:
        layout = Layout(Path(built["layout"]))
        held = set(_run([*ctr, "content", "ls", "--quiet"]).split())
        entries, blobs = [], {}
        for n in todo:
            desc = layout.tags()[wanted[n]["layout_tag"]]
            config = layout.read_json(layout.manifest(wanted[n]["layout_tag"])["config"]["digest"])
            platform = {"architecture": config["architecture"], "os": config["os"]}
            entries.append((desc, wanted[n]["reference"], platform))
            for blob in layout.blobs(wanted[n]["layout_tag"]):
                if blob["digest"] not in held:
                    blobs[blob["digest"]] = blob
        size = record.human_size(sum(b["size"] for b in blobs.values()))
        progress(f"importing {', '.join(todo)} into containerd ({size} of new blobs)")
        argv = [*ctr, "images", "import"]
        argv += [f"--snapshotter={snapshotter}"] if snapshotter else []
        _stream([*argv, "-"], layout, archive_index(entries), list(blobs.values()))
    for n in names:
        if n not in todo:
            progress(f"{n}: containerd has {wanted[n]['reference']} already")
    return {n: wanted[n]["reference"] for n in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m images.containerd_load")
    parser.add_argument("names", nargs="*", help="images to import (default: every built one)")
    parser.add_argument("--address", default=DEFAULT_ADDRESS, help="containerd's socket")
    parser.add_argument("--namespace", default="k8s.io")
    parser.add_argument("--ctr", default="ctr", help="the ctr binary")
    parser.add_argument("--snapshotter")
    parser.add_argument(
        "--prune", action="store_true", help=f"remove {REPOSITORY} images of earlier builds"
    )
    parser.add_argument("--cache", type=Path, help="instead of $INFERGRID_CACHE/images")
    args = parser.parse_args(argv)
    try:
        loaded = load(
            args.names,
            ctr_binary=args.ctr,
            address=args.address,
            namespace=args.namespace,
            snapshotter=args.snapshotter,
            cache=args.cache,
            prune=args.prune,
        )
    except LoadError as e:
        print(f"[images] error: {e}", file=sys.stderr)
        return 1
    for name, reference in loaded.items():
        print(f"{name}\t{reference}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
