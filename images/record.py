"""What was built: images.json in the cache (name -> reference and manifest digest),
read by the loader, and the table `make images` prints."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

RECORD = "images.json"


@dataclass(frozen=True)
class BuiltImage:
    name: str
    reference: str  # docker.io/infergrid/<name>:<tag>
    tag: str  # from the hash of the image's inputs
    digest: str  # of its manifest
    size: int  # bytes of its blobs as stored: compressed layers, config, manifest
    layout_tag: str  # its tag in the OCI layout
    seconds: float  # build time in this run; 0 when it was already built


def read(path: Path) -> dict:
    """The record, or an empty one."""
    if not path.exists():
        return {"layout": None, "images": {}}
    return json.loads(path.read_text())


def update(path: Path, layout: Path, built: dict[str, BuiltImage]) -> dict:
    """Replaces the entries of the images just built; keeps the others."""
    record = read(path)
    record["layout"] = str(layout)
    for name, image in built.items():
        entry = asdict(image)
        del entry["seconds"], entry["name"]
        record["images"][name] = entry
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return record


def human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def table(images: list[BuiltImage]) -> str:
    rows = [("image", "tag", "manifest digest", "size", "build s")]
    for i in images:
        built = f"{i.seconds:.1f}" if i.seconds else "cached"
        rows.append((i.name, i.tag, i.digest, human_size(i.size), built))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    return "\n".join(lines)
