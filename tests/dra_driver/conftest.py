"""GPUs as plain data for the DRA driver's tests: an A100 node with NVLink, and MIG."""

from __future__ import annotations

from dataclasses import replace

from infergrid.constants import LINK_NVLINK, LINK_PCIE_SWITCH
from infergrid.inventory import Gpu, GpuLink, MigInstance

NODE = "node-a"


def gpu(index: int, **changes) -> Gpu:
    base = Gpu(
        uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
        index=index,
        model="NVIDIA A100-SXM4-80GB",
        memory_mib=81920,
        sm_count=108,
        compute_capability="8.0",
        numa_node=index // 2,
        healthy=True,
    )
    return replace(base, **changes)


def nvlinked(*indexes: int) -> list[Gpu]:
    """GPUs ``indexes`` joined pairwise by NVLink, each also on a PCIe switch with GPU 99."""
    return [
        gpu(
            i,
            links=tuple(GpuLink(p, LINK_NVLINK, 12) for p in indexes if p != i)
            + (GpuLink(99, LINK_PCIE_SWITCH),),
        )
        for i in indexes
    ]


def mig_gpu(index: int, profiles: tuple[tuple[str, int], ...]) -> Gpu:
    instances = tuple(
        MigInstance(profile, f"MIG-{index}-{n}", memory, 108 * int(profile[0]) // 7)
        for n, (profile, memory) in enumerate(profiles)
    )
    return gpu(index, mig_enabled=True, mig_instances=instances)


MIG_3_2_2 = (("3g.40gb", 40192), ("2g.20gb", 19968), ("2g.20gb", 19968))
