"""Which backend a node agent reads its GPUs through: the real NVML, or the fake fed the
node's entry of a fleet file. The device plugin and the DRA driver open it the same way."""

from __future__ import annotations

from pathlib import Path

from infergrid.errors import ContractError
from infergrid.fleet import load_fleet
from infergrid.nvml.backend import NvmlBackend


def open_backend(fake_fleet: Path | None, node_name: str) -> NvmlBackend:
    """The real NVML without a fleet file; else the fake of ``node_name``'s entry there, which
    must exist (the error names the nodes the file has)."""
    if fake_fleet is None:
        from infergrid.nvml.real import RealNvml  # pynvml only where a GPU is read

        return RealNvml()
    from infergrid.nvml.fake import FakeNvml

    nodes = {n.name: n for n in load_fleet(fake_fleet).nodes}
    if node_name not in nodes:
        raise ContractError(
            "nodeName", f"{node_name!r} is not in {fake_fleet} ({', '.join(nodes)})"
        )
    return FakeNvml(nodes[node_name])
