"""Rating a node for a pod: one raw scorer per policy, then one normalise step across nodes.

A raw scorer sees the node before and after the pod's placement and returns a
float, higher is better, on whatever scale suits it. ``normalize_scores`` is the
only place that maps raw scores of the feasible nodes onto the extender's 0–10
integers, with every edge case of the arithmetic written out.
"""

import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Final

from infergrid.constants import (
    PLACEMENT_POLICIES,
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
from infergrid.errors import ContractError
from infergrid.placement.baselines import (
    best_fit_score,
    dot_product_score,
    fgd_paper_score,
    gpu_clustering_score,
    gpu_packing_score,
    random_fit_score,
)
from infergrid.placement.fgd_cluster_aware import fgd_cluster_aware_score
from infergrid.placement.fragmentation import Workload, fragmentation_before, node_fragmentation
from infergrid.placement.state import NodeState

MAX_EXTENDER_PRIORITY: Final = 10
"""kube-scheduler's MaxExtenderPriority: an extender's scores run from 0 to this."""

EQUAL_SCORE: Final = MAX_EXTENDER_PRIORITY
"""What every node gets when all raw scores are equal: none is worse than another."""

RAW_TOLERANCE: Final = 1e-9
"""Raw scores closer than this count as equal, so float noise is not stretched to 0 and 10."""

GPU_COUNT_WEIGHT: Final = 1e-3
"""Fullness is memory first; the busy-GPU fraction, weighted this little, only breaks ties."""

RawScorer = Callable[[NodeState, NodeState, Workload], float]
"""(node before, node after placing the pod, workload) → raw score, higher is better."""


def fullness(node: NodeState) -> float:
    """Held fraction of the memory the node's GPUs offer, plus a little for busy GPUs.

    A node offering no GPU memory at all is 0: it has nothing to fill.
    """
    total = held = gpus = busy = 0
    for gpu in node.gpus:
        if gpu.available:
            total += gpu.memory_mib
            held += gpu.held_mib
            gpus += 1
            busy += gpu.busy
    if total == 0:
        return 0.0
    return held / total + GPU_COUNT_WEIGHT * busy / gpus


def binpack_score(before: NodeState, after: NodeState, workload: Workload) -> float:
    """binpack: the fuller the node ends up, the better; keeps other nodes empty."""
    return fullness(after)


def spread_score(before: NodeState, after: NodeState, workload: Workload) -> float:
    """spread: the emptier the node ends up, the better; keeps pods apart."""
    return -fullness(after)


def fgd_score(before: NodeState, after: NodeState, workload: Workload) -> float:
    """fgd: minus the increase in node fragmentation, so the smallest increase scores best."""
    return fragmentation_before(before, workload) - node_fragmentation(after, workload)


RAW_SCORERS: Final[Mapping[str, RawScorer]] = MappingProxyType(
    {
        POLICY_BINPACK: binpack_score,
        POLICY_SPREAD: spread_score,
        POLICY_FGD: fgd_score,
        POLICY_FGD_CLUSTER_AWARE: fgd_cluster_aware_score,
    }
)
"""The raw scorer of each policy a pod may ask for (``PLACEMENT_POLICIES``)."""

SIMULATION_SCORERS: Final[Mapping[str, RawScorer]] = MappingProxyType(
    {
        POLICY_FGD_PAPER: fgd_paper_score,
        POLICY_BEST_FIT: best_fit_score,
        POLICY_DOT_PRODUCT: dot_product_score,
        POLICY_GPU_PACKING: gpu_packing_score,
        POLICY_GPU_CLUSTERING: gpu_clustering_score,
        POLICY_RANDOM_FIT: random_fit_score,
    }
)
"""Raw scorers of policies only the trace simulator runs: the FGD paper's FGD and
baselines. They resolve like any policy, but no pod can ask for them."""


def policy_names() -> tuple[str, ...]:
    """Every policy name that resolves: the pods' first, then the simulation-only ones."""
    return (*PLACEMENT_POLICIES, *SIMULATION_SCORERS)


def raw_scorer(policy: str) -> RawScorer:
    """The raw scorer of ``policy``; an unknown name fails here, before any node is scored."""
    scorer = RAW_SCORERS.get(policy) or SIMULATION_SCORERS.get(policy)
    if scorer is None:
        known = ", ".join(policy_names())
        raise ContractError("policy", f"{policy!r} is not one of {known}")
    return scorer


def normalize_scores(raw: Sequence[float]) -> list[int]:
    """Raw scores of the feasible nodes mapped linearly onto 0..MAX_EXTENDER_PRIORITY.

    The best node gets 10 and the worst 0, rounded half up. Edge cases: no nodes
    give an empty list; scores within ``RAW_TOLERANCE`` of each other all get
    ``EQUAL_SCORE``; a non-finite raw score (no scorer here makes one) gets 0,
    and the rest are scaled without it. No NaN can come out.
    """
    finite = [r for r in raw if math.isfinite(r)]
    if not finite:
        return [0] * len(raw)
    low, high = min(finite), max(finite)
    if high - low <= RAW_TOLERANCE:
        return [EQUAL_SCORE if math.isfinite(r) else 0 for r in raw]
    half_span = high / 2 - low / 2  # halves first: high - low may overflow to inf
    return [
        math.floor((r / 2 - low / 2) / half_span * MAX_EXTENDER_PRIORITY + 0.5)
        if math.isfinite(r)
        else 0
        for r in raw
    ]
