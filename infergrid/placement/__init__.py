"""The placement core: which node and which GPUs a pod gets, as pure functions over plain data.

The scheduler extender serves it and the trace simulator replays it, so it does
no I/O and reads no clock. The flow, per pod: ``resolve_policy`` once, then for
each node ``fit`` (every shortfall, or the placement) and a raw score, then
``normalize_scores`` across the feasible nodes. ``NodeSet`` is the one entry point
the extender and the simulator ask: it holds many nodes' states and answers filter
(every node's verdict, with all its shortfalls) and raw scores for them all.
``build_node_state`` makes a node from its annotations; ``apply`` and
``release`` keep it current; ``to_pod_assignment`` writes what bind records.
``recheck`` is the device plugin's gate at Allocate: the same rules, applied to
an assignment already decided. ``choose_victims`` answers preemption: the fewest
lower-priority holders whose eviction lets a pod fit.
The trace simulator also passes a ``HostRequest`` (CPU, memory, GPU models) on
nodes with ``HostResources``, and runs the simulation-only policies (the FGD
paper's baselines) from ``SIMULATION_SCORERS`` and ``SIMULATION_GPU_CHOICES``.
``OfferIndex`` is its fast path: fit, binpack and spread scores and reasons for the
common pods (one share or whole-GPU container) on thousands of nodes at once, in numpy.
``LearnedWorkload`` is the workload fgd and fgd-cluster-aware score against, learned
from the pods seen, in both.
"""

from infergrid.placement.build import build_node_state, idle_usage
from infergrid.placement.fgd_cluster_aware import model_contention, with_cluster
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
from infergrid.placement.gpu_choice import GPU_CHOICES, SIMULATION_GPU_CHOICES, GpuChoice
from infergrid.placement.host import HostRequest, host_shortfalls, reserve_host
from infergrid.placement.learned import LEARNING, LearnedWorkload
from infergrid.placement.node_set import NodeSet, Verdicts
from infergrid.placement.offers import OfferIndex, Rejections
from infergrid.placement.policy import Policy, resolve_policy
from infergrid.placement.preemption import Holder, cheapest_node, choose_victims, without
from infergrid.placement.recheck import recheck
from infergrid.placement.recorded_assignment import reservation_from_assignment, to_pod_assignment
from infergrid.placement.reserve import apply, release
from infergrid.placement.scoring import (
    EQUAL_SCORE,
    MAX_EXTENDER_PRIORITY,
    RAW_SCORERS,
    SIMULATION_SCORERS,
    normalize_scores,
    policy_names,
    raw_scorer,
)
from infergrid.placement.shortfall import Shortfall
from infergrid.placement.state import (
    ALL_CORES,
    IDLE_USED_MIB,
    AssignmentIssue,
    GpuState,
    HostResources,
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
    "SIMULATION_GPU_CHOICES",
    "SIMULATION_SCORERS",
    "AssignmentIssue",
    "Demand",
    "FitResult",
    "FragmentationTally",
    "GpuChoice",
    "GpuState",
    "Holder",
    "HostRequest",
    "HostResources",
    "MigSlot",
    "LEARNING",
    "LearnedWorkload",
    "NodeSet",
    "NodeState",
    "OfferIndex",
    "Policy",
    "Rejections",
    "Shortfall",
    "Verdicts",
    "Workload",
    "apply",
    "build_node_state",
    "cheapest_node",
    "choose_gpu_set",
    "choose_victims",
    "fit",
    "free_capacity",
    "host_shortfalls",
    "idle_usage",
    "model_contention",
    "node_fragmentation",
    "normalize_scores",
    "policy_names",
    "raw_scorer",
    "recheck",
    "release",
    "reservation_from_assignment",
    "reserve_host",
    "resolve_policy",
    "task_fragmentation",
    "to_pod_assignment",
    "with_cluster",
    "without",
]
