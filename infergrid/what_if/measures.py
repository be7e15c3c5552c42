"""What a placement leaves free, measured on node states: the numbers `infergrid what-if` prints.

* free nodes: nodes that offer and on which nothing holds any GPU (a GPU in MIG
  mode counts as free while none of its instances is taken);
* free GPUs: GPUs that offer and that nothing holds, which a pod could take whole;
* stranded memory: the simulator's fragmentation F_n (``node_fragmentation``: for
  each typical pod, the free capacity of the GPUs it cannot use, or of them all
  where it cannot run on the node), weighted by popularity as F_n is, but counting
  each such GPU's free memory in MiB instead of its free fraction. On GPUs whose
  free memory and free SMs are the same fraction (the trace's) it is exactly F_n
  times the GPU's memory;
* fragmentation % and unallocated GPU %: the simulator's (``node_fragment``):
  100 × Σ F_n ÷ Σ idle(n), and 100 × Σ idle(n) ÷ the GPUs, idle(n) the node's free
  capacity in milli-GPUs.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from infergrid.placement import NodeState, Workload, free_capacity
from infergrid.placement.state import GpuState
from infergrid.simulate.metrics import fragmentation_rate, node_fragment
from infergrid.simulate.trace import MILLI_GPU


@dataclass(frozen=True, slots=True)
class Measures:
    """The numbers of one placement of the cluster (see the module)."""

    free_nodes: tuple[str, ...]
    free_gpus: int
    stranded_mib: float
    fragmentation_pct: float
    unallocated_pct: float


def measure(nodes: Sequence[NodeState], typical: Workload) -> Measures:
    """The measures of the nodes, over the typical pods."""
    fragment = idle = 0.0
    for node in nodes:
        f, i = node_fragment(node, typical)
        fragment += f
        idle += i
    capacity = sum(len(n.gpus) for n in nodes) * MILLI_GPU
    return Measures(
        free_nodes=tuple(n.name for n in nodes if is_free(n)),
        free_gpus=sum(1 for n in nodes if n.offers for g in n.gpus if g.available and g.idle),
        stranded_mib=sum(stranded_mib(n, typical) for n in nodes),
        fragmentation_pct=fragmentation_rate(fragment, idle),
        unallocated_pct=100.0 * idle / capacity if capacity else 0.0,
    )


def is_free(node: NodeState) -> bool:
    """Whether the node offers GPUs and nothing holds any of them."""
    return node.offers and bool(node.gpus) and all(map(_unheld, node.gpus))


def stranded_mib(node: NodeState, typical: Workload) -> float:
    """F_n of the node in MiB (see the module)."""
    if not node.offers:
        return 0.0
    free = [g.free_mib if free_capacity(g) > 0 else 0 for g in node.gpus]
    stranded = 0.0
    for demand, popularity in typical.tasks:
        usable = [demand.usable_on(g) for g in node.gpus]
        shut_out = demand.shut_out(node) or sum(usable) < demand.gpus_needed
        stranded += popularity * sum(
            f for f, u in zip(free, usable, strict=True) if shut_out or not u
        )
    return stranded


def _unheld(gpu: GpuState) -> bool:
    if gpu.mig_enabled:
        return not any(slot.taken for slot in gpu.mig)
    return gpu.idle
