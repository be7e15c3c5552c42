"""Generates the Python stubs of the kubelet API from its proto with grpcio-tools.

`python -m device_plugin.kubelet.codegen` rewrites the committed stubs; tests
call `generate` into a scratch folder and compare, so stubs never drift.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PROTO = Path("device_plugin/kubelet/v1beta1/api.proto")
OUTPUTS = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def generate(root: Path) -> list[Path]:
    """Writes the stubs for `root/PROTO` next to it and returns their paths."""
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"--python_out={root}",
        f"--pyi_out={root}",
        f"--grpc_python_out={root}",
        str(root / PROTO),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {root / PROTO}")
    return [root / PROTO.parent / name for name in OUTPUTS]


def generate_into(scratch: Path) -> list[Path]:
    """Generates from a copy of the proto under `scratch`, leaving the tree untouched."""
    target = scratch / PROTO
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ROOT / PROTO, target)
    return generate(scratch)


if __name__ == "__main__":
    for path in generate(ROOT):
        print(path.relative_to(ROOT))
    sys.exit(0)
