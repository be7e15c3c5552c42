"""Which GPU of a node gets a share, which MIG instance a MIG request gets, and which GPUs
time slices go to, per policy.

Every candidate already fits; the policy only orders them. Each chooser is one
``min`` with a key whose last part is the GPU index, so equal candidates always
resolve the same way and a replayed trace places pods identically.
"""

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from infergrid.constants import (
    POLICY_BEST_FIT,
    POLICY_BINPACK,
    POLICY_DOT_PRODUCT,
    POLICY_FGD,
    POLICY_FGD_CLUSTER_AWARE,
    POLICY_FGD_PAPER,
    POLICY_GPU_CLUSTERING,
    POLICY_GPU_PACKING,
    POLICY_RANDOM_FIT,
    POLICY_SPREAD,
)
from infergrid.placement.fragmentation import FragmentationTally, Workload
from infergrid.placement.reserve import reserved_share
from infergrid.placement.state import GpuState, MigSlot, NodeState
from infergrid.placement.topology import choose_gpu_set

ShareChooser = Callable[[NodeState, Sequence[GpuState], int, int, Workload, int], GpuState]
"""(node, fitting GPUs, share memory MiB, share cores, workload, salt) → the GPU to use.

``salt`` is the policy's per-pod random number; only choosers that pick at random read it.
"""

_DIGITS: Final = 9
"""Fragmentation deltas are rounded to this many decimals before comparing, so float noise
from summing in a different order cannot break a tie that is really a tie."""


@dataclass(frozen=True, slots=True)
class GpuChoice:
    """How a policy picks within a node: a share chooser, and whether MIG instances and time
    slices pack onto the GPUs already most used."""

    share: ShareChooser
    packs: bool


def fullest_gpu(
    node: NodeState,
    fits: Sequence[GpuState],
    memory_mib: int,
    cores: int,
    workload: Workload,
    salt: int = 0,
) -> GpuState:
    """binpack: the GPU with least free memory, then fewest free SMs."""
    return min(fits, key=lambda g: (g.free_mib, g.free_cores, g.index))


def emptiest_gpu(
    node: NodeState,
    fits: Sequence[GpuState],
    memory_mib: int,
    cores: int,
    workload: Workload,
    salt: int = 0,
) -> GpuState:
    """spread: the GPU with most free memory, then most free SMs."""
    return min(fits, key=lambda g: (-g.free_mib, -g.free_cores, g.index))


def least_fragmenting_gpu(
    node: NodeState,
    fits: Sequence[GpuState],
    memory_mib: int,
    cores: int,
    workload: Workload,
    salt: int = 0,
) -> GpuState:
    """fgd: the GPU whose taking the share raises node fragmentation least; then binpack."""
    tally = FragmentationTally(node, workload)
    before = tally.total()

    def key(gpu: GpuState) -> tuple[float, int, int, int]:
        after = reserved_share(gpu, memory_mib, cores)
        increase = round(tally.total_if(gpu, after) - before, _DIGITS)
        return (increase, gpu.free_mib, gpu.free_cores, gpu.index)

    return min(fits, key=key)


def random_gpu(
    node: NodeState,
    fits: Sequence[GpuState],
    memory_mib: int,
    cores: int,
    workload: Workload,
    salt: int = 0,
) -> GpuState:
    """random-fit: any fitting GPU, drawn with ``salt`` as the seed, so a replay repeats it."""
    return fits[random.Random(salt).randrange(len(fits))]


def choose_whole(
    free: Sequence[GpuState], count: int, nvlink_required: bool, packs: bool
) -> tuple[GpuState, ...] | None:
    """``count`` GPUs for a whole-GPU request: ``choose_gpu_set`` among the GPUs with the
    most time-slice holders (``packs``) or the fewest, widening until a set is found.

    Packing time slices leaves the other GPUs untouched for shares and for pods asking
    for several GPUs; spreading them gives each holder more of a GPU. Without time
    slices every free GPU has no holder, so this is ``choose_gpu_set`` itself.
    """
    for level in sorted({g.holders for g in free}, reverse=packs):
        within = [g for g in free if (g.holders >= level if packs else g.holders <= level)]
        chosen = choose_gpu_set(within, count, nvlink_required)
        if chosen is not None:
            return chosen
    return None


def choose_mig(free: Sequence[tuple[GpuState, MigSlot]], packs: bool) -> tuple[GpuState, MigSlot]:
    """The instance on the GPU with most (packs) or fewest taken instances; then by index."""
    sign = -1 if packs else 1

    def key(pair: tuple[GpuState, MigSlot]) -> tuple[int, int, str]:
        gpu, slot = pair
        return (sign * sum(s.taken for s in gpu.mig), gpu.index, slot.uuid)

    return min(free, key=key)


GPU_CHOICES: Final[Mapping[str, GpuChoice]] = MappingProxyType(
    {
        POLICY_BINPACK: GpuChoice(share=fullest_gpu, packs=True),
        POLICY_SPREAD: GpuChoice(share=emptiest_gpu, packs=False),
        POLICY_FGD: GpuChoice(share=least_fragmenting_gpu, packs=True),
        POLICY_FGD_CLUSTER_AWARE: GpuChoice(share=least_fragmenting_gpu, packs=True),
    }
)
"""The GPU choice of each policy a pod may ask for."""

SIMULATION_GPU_CHOICES: Final[Mapping[str, GpuChoice]] = MappingProxyType(
    {
        POLICY_FGD_PAPER: GpuChoice(share=least_fragmenting_gpu, packs=True),
        # The paper's "best" GPU selection: the fitting GPU with least left, as binpack.
        POLICY_BEST_FIT: GpuChoice(share=fullest_gpu, packs=True),
        POLICY_DOT_PRODUCT: GpuChoice(share=fullest_gpu, packs=True),
        POLICY_GPU_PACKING: GpuChoice(share=fullest_gpu, packs=True),
        POLICY_GPU_CLUSTERING: GpuChoice(share=fullest_gpu, packs=True),
        POLICY_RANDOM_FIT: GpuChoice(share=random_gpu, packs=True),
    }
)
"""The GPU choice of each policy only the trace simulator runs (see ``SIMULATION_SCORERS``)."""
