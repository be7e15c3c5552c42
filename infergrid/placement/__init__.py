"""The placement core: which node and which GPUs a pod gets, as pure functions over plain data.

The scheduler extender serves it and the trace simulator replays it, so it does
no I/O and reads no clock. The flow, per pod: ``resolve_policy`` once, then for
each node ``fit`` (every shortfall, or the placement) and a raw score, then
``normalize_scores`` across the feasible nodes; ``score_nodes`` does all of it.
``build_node_state`` makes a node from its annotations; ``apply`` and
``release`` keep it current; ``to_pod_assignment`` writes what bind records.
"""

from infergrid.placement.assignments import reservation_from_assignment, to_pod_assignment
from infergrid.placement.build import build_node_state, idle_usage
from infergrid.placement.fit import FitResult, fit
from infergrid.placement.fragmentation import (
    DEFAULT_WORKLOAD,
    Demand,
    FragmentationTally,
    Workload,
    free_capacity,
    node_fragmentation,
    task_fragmentation,
)
from infergrid.placement.gpu_choice import GPU_CHOICES, GpuChoice
from infergrid.placement.policy import Policy, resolve_policy
from infergrid.placement.rank import NodeScore, best_node, score_nodes
from infergrid.placement.reserve import apply, release
from infergrid.placement.scoring import (
    EQUAL_SCORE,
    MAX_EXTENDER_PRIORITY,
    RAW_SCORERS,
    normalize_scores,
    raw_scorer,
)
from infergrid.placement.shortfall import Shortfall
from infergrid.placement.state import (
    ALL_CORES,
    IDLE_USED_MIB,
    AssignmentIssue,
    GpuState,
    MigSlot,
    NodeState,
)
from infergrid.placement.topology import choose_gpu_set

__all__ = [
    "ALL_CORES",
    "DEFAULT_WORKLOAD",
    "EQUAL_SCORE",
    "GPU_CHOICES",
    "IDLE_USED_MIB",
    "MAX_EXTENDER_PRIORITY",
    "RAW_SCORERS",
    "AssignmentIssue",
    "Demand",
    "FitResult",
    "FragmentationTally",
    "GpuChoice",
    "GpuState",
    "MigSlot",
    "NodeScore",
    "NodeState",
    "Policy",
    "Shortfall",
    "Workload",
    "apply",
    "best_node",
    "build_node_state",
    "choose_gpu_set",
    "fit",
    "free_capacity",
    "idle_usage",
    "node_fragmentation",
    "normalize_scores",
    "raw_scorer",
    "release",
    "reservation_from_assignment",
    "resolve_policy",
    "score_nodes",
    "task_fragmentation",
    "to_pod_assignment",
]
