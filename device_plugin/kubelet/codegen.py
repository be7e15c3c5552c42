"""Generates the Python stubs of the kubelet APIs from their protos with grpcio-tools.

`python -m device_plugin.kubelet.codegen` rewrites the committed stubs; tests
call `generate` into a scratch folder and compare, so stubs never drift.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PROTOS = (
    Path("device_plugin/kubelet/v1beta1/api.proto"),
    Path("device_plugin/kubelet/podresources/v1/api.proto"),
    Path("dra_driver/kubelet/dra/v1/api.proto"),
    Path("dra_driver/kubelet/pluginregistration/v1/api.proto"),
)
"""The device plugin API (the plugin serves it), the PodResources API (the plugin reads it),
and the DRA and plugin-registration APIs (the DRA driver serves both): one generator for every
kubelet API in the project, so all stubs come from the same grpcio-tools."""
PROTO = PROTOS[0]
OUTPUTS = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def _generate_one(root: Path, proto: Path) -> list[Path]:
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"--python_out={root}",
        f"--pyi_out={root}",
        f"--grpc_python_out={root}",
        str(root / proto),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {root / proto}")
    return [root / proto.parent / name for name in OUTPUTS]


def generate(root: Path) -> list[Path]:
    """Writes the stubs for every proto under `root` next to it and returns their paths."""
    return [path for proto in PROTOS for path in _generate_one(root, proto)]


def generate_into(scratch: Path) -> list[Path]:
    """Generates from copies of the protos under `scratch`, leaving the tree untouched."""
    for proto in PROTOS:
        target = scratch / proto
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / proto, target)
    return generate(scratch)


if __name__ == "__main__":
    for path in generate(ROOT):
        print(path.relative_to(ROOT))
    sys.exit(0)
