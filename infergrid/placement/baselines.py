"""The FGD paper's baseline scorers, as raw scorers: the yardsticks the simulator compares with.

Each is the paper's kube-scheduler score plugin (Weng et al., USENIX ATC '23,
and the trace README in ``shared/traces/openb``) on kube-scheduler's 0–100
range, higher is better, seen through our (before, after) interface: what a pod
takes is ``before`` less ``after``. The plugins' integer steps are kept where
they decide a rank (GPU packing and clustering compute in integers); the
simulator truncates every baseline score to an integer, as the plugins return
int64. Units follow the paper: CPU in millicores, GPU in milli-GPUs (1000 is a
whole GPU; a GPU's free milli is its ``free_capacity``).

Normalising constants are the paper's "largest node spec" of the openb cluster
(128 cores, 8 GPUs). Nodes without ``host`` (the extender's) count no CPU.
"""

import math
from typing import Final

from infergrid.placement.fragmentation import Workload, free_capacity, node_fragmentation
from infergrid.placement.state import GpuState, NodeState

MAX_NODE_SCORE: Final = 100
"""kube-scheduler's MaxNodeScore: a score plugin's range is 0 to this."""

MAX_SPEC_CPU_MILLI: Final = 128_000
"""The paper's MaxSpecCpu: the most CPU any openb node has."""

MAX_SPEC_GPU_MILLI: Final = 8_000
"""The paper's MaxSpecGpu: the most GPUs any openb node has, in milli-GPUs."""

MILLI_GPU: Final = 1000

_SHARE_CLASS: Final = "share"
_WHOLE_CLASS: Final = "whole"


def gpu_milli_free(node: NodeState) -> float:
    """Unallocated milli-GPUs of the node: Σ free(g) × 1000."""
    return sum(free_capacity(g) for g in node.gpus) * MILLI_GPU


def cpu_milli_free(node: NodeState) -> int:
    """Millicores free on the node; 0 where the node does not track CPU."""
    return node.host.free_cpu_milli if node.host is not None else 0


def _milli(gpu: GpuState) -> int:
    return round(free_capacity(gpu) * MILLI_GPU)


def _taken(before: NodeState, after: NodeState) -> list[tuple[GpuState, GpuState]]:
    """The GPUs the pod took part of, each as (before, after)."""
    return [(b, a) for b, a in zip(before.gpus, after.gpus, strict=True) if a is not b and a != b]


def fgd_paper_score(before: NodeState, after: NodeState, workload: Workload) -> float:
    """fgd-paper: the paper's FGD plugin, 100 × sigmoid(decrease of node fragmentation), the
    decrease in whole GPUs (the plugin's milli-GPUs ÷ 1000). The same ranking as the
    extender's fgd, squeezed into integer steps: nodes within ~0.04 GPU of each other tie."""
    decrease = node_fragmentation(before, workload) - node_fragmentation(after, workload)
    return MAX_NODE_SCORE / (1.0 + math.exp(-decrease))


def best_fit_score(before: NodeState, after: NodeState, workload: Workload) -> float:
    """best-fit: least CPU and GPU left after placement, each over the largest node, half each."""
    left = 0.5 * cpu_milli_free(after) / MAX_SPEC_CPU_MILLI
    left += 0.5 * gpu_milli_free(after) / MAX_SPEC_GPU_MILLI
    return MAX_NODE_SCORE * (1.0 - left)


def dot_product_score(before: NodeState, after: NodeState, workload: Workload) -> float:
    """dot-product (Tetris): the node's free (CPU, GPU) dotted with the pod's demand, both over
    the largest node; the smaller the product, the higher the score. The GPUs are merged into
    one dimension (the paper's "merge" extension)."""
    cpu_free, gpu_free = cpu_milli_free(before), gpu_milli_free(before)
    cpu_asked = cpu_free - cpu_milli_free(after)
    gpu_asked = gpu_free - gpu_milli_free(after)
    dot = (cpu_free / MAX_SPEC_CPU_MILLI) * (cpu_asked / MAX_SPEC_CPU_MILLI)
    dot += (gpu_free / MAX_SPEC_GPU_MILLI) * (gpu_asked / MAX_SPEC_GPU_MILLI)
    return MAX_NODE_SCORE * (1.0 - dot / 2)


def gpu_packing_score(before: NodeState, after: NodeState, workload: Workload) -> float:
    """gpu-packing, best first: GPUs already shared (75–100 by how full they are), then fully
    free GPUs on a node in use (33–50), then a node with every GPU free (up to 33).
    A pod without GPUs scores 0 everywhere."""
    taken = _taken(before, after)
    if not taken:
        return 0
    free_gpus = sum(g.takes_whole() for g in before.gpus)
    if free_gpus == len(before.gpus):
        return max(MAX_NODE_SCORE // 3 - free_gpus, free_gpus)
    fresh = sum(b.takes_whole() for b, _ in taken)
    if fresh:
        return max(MAX_NODE_SCORE // 2 - fresh, MAX_NODE_SCORE // 3)
    free_percent = sum(_milli(b) * 100 // MILLI_GPU for b, _ in taken)
    return max(MAX_NODE_SCORE - free_percent // 10, MAX_NODE_SCORE // 2)


def _classes(node: NodeState) -> set[str]:
    """The GPU-request classes of the pods on the node: shares, whole GPUs, or both."""
    found = set()
    for gpu in node.gpus:
        if gpu.shares:
            found.add(_SHARE_CLASS)
        if gpu.held_whole:
            found.add(_WHOLE_CLASS)
    return found


def gpu_clustering_score(before: NodeState, after: NodeState, workload: Workload) -> float:
    """gpu-clustering: nodes that host only the pod's GPU-request class first (75–100), then
    nodes that host it among others (50–75), then idle nodes (25–50), then the rest (0–25);
    fuller nodes first within each band. Classes are share and whole, as the GPU state records
    them (the paper also tells whole-GPU counts apart). A pod without GPUs scores 0."""
    taken = _taken(before, after)
    if not taken:
        return 0
    was, now = taken[0]
    wanted = _SHARE_CLASS if now.shares > was.shares else _WHOLE_CLASS
    quarter = MAX_NODE_SCORE // 4
    fullness = quarter * (MAX_SPEC_GPU_MILLI - round(gpu_milli_free(before))) // MAX_SPEC_GPU_MILLI
    present = _classes(before)
    if wanted in present:
        return fullness + (3 * quarter if len(present) == 1 else 2 * quarter)
    return fullness + (quarter if not present else 0)


def random_fit_score(before: NodeState, after: NodeState, workload: Workload) -> float:
    """random-fit: every feasible node scores the same, so the pick among them is at random."""
    return 0.0
