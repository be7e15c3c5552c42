"""The policies a simulation compares, and how the simulated kube-scheduler picks among nodes.

Every policy is a placement-core policy (``resolve_policy``: a GPU choice and a
raw scorer from the core's tables) plus the two things kube-scheduler adds when
it picks a node from the scores:

* ``integer_scores``: the paper's score plugins return int64 on 0–100, so
  nodes whose scores differ by less than one tie. The paper's policies keep
  that, or their published numbers cannot be reproduced (dot-product's scores,
  for one, span only a few integers). Ours compare raw scores (to 9 decimals,
  as the core's GPU choice does), as ``best_node`` does for simulators;
  fgd-cluster-aware steps its own.
* ``tie_break``: ``order`` takes the first of the best nodes in the seed's
  node order. That is what the paper's runs did: its simulator pins
  kube-scheduler to a fork whose selectHost takes the lexicographically first
  name among ties, and prefixes each node's name with its place in a seeded
  shuffle. (Upstream kube-scheduler picks at random, which spreads pods over
  every equal node and packs far worse.) It is also what ``best_node`` does
  with names. ``random`` picks uniformly: random-fit's only choice.

fgd-paper weighs fragmentation over the trace's typical pods (``typical_workload``),
like the paper; fgd and fgd-cluster-aware learn theirs from the pods as the extender
does (``placement.LEARNING``), or read the trace's with ``--workload trace``; the other
policies ignore the workload.
"""

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

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
from infergrid.errors import ContractError
from infergrid.placement import Demand, Workload
from infergrid.simulate.cluster import share_of
from infergrid.simulate.trace import MILLI_GPU, TracePod

TieBreak = Literal["random", "order"]

TYPICAL_COVERAGE: Final = 0.95
"""The paper's typical pods: the most frequent shapes that together cover 95% of pods."""

TYPICAL_STEP: Final = 10
"""The paper's simulator takes typical shapes ten at a time until they cover enough pods."""


@dataclass(frozen=True, slots=True)
class SimPolicy:
    """A policy of the simulator: the core policy it runs and how the best node is picked.

    ``paper`` is the policy's label in the paper's reference results, for the
    side-by-side tables; None for policies the paper did not run.
    """

    name: str
    core: str
    integer_scores: bool
    tie_break: TieBreak
    paper: str | None
    summary: str


SIM_POLICIES: Final[Mapping[str, SimPolicy]] = MappingProxyType(
    {
        p.name: p
        for p in (
            SimPolicy(
                POLICY_FGD_CLUSTER_AWARE,
                POLICY_FGD_CLUSTER_AWARE,
                False,
                "order",
                None,
                "ours: fgd, less GPUs stranded without CPU and GPUs of contested models",
            ),
            SimPolicy(
                POLICY_FGD,
                POLICY_FGD,
                False,
                "order",
                None,
                "the extender's fgd: least increase of fragmentation over the typical pods",
            ),
            SimPolicy(
                POLICY_BINPACK,
                POLICY_BINPACK,
                False,
                "order",
                None,
                "the extender's binpack: fullest node by GPU memory",
            ),
            SimPolicy(
                POLICY_SPREAD,
                POLICY_SPREAD,
                False,
                "order",
                None,
                "the extender's spread: emptiest node by GPU memory",
            ),
            SimPolicy(
                POLICY_FGD_PAPER,
                POLICY_FGD_PAPER,
                True,
                "order",
                "06-FGD",
                "the paper's FGD plugin: fgd on its integer 0-100 sigmoid scale",
            ),
            SimPolicy(
                POLICY_BEST_FIT,
                POLICY_BEST_FIT,
                True,
                "order",
                "05-BestFit",
                "paper baseline: least CPU and GPU left, half each",
            ),
            SimPolicy(
                POLICY_DOT_PRODUCT,
                POLICY_DOT_PRODUCT,
                True,
                "order",
                "02-DotProd",
                "paper baseline: Tetris dot product of free and asked (CPU, GPU)",
            ),
            SimPolicy(
                POLICY_GPU_PACKING,
                POLICY_GPU_PACKING,
                True,
                "order",
                "04-GpuPacking",
                "paper baseline: shared GPUs, then free GPUs of used nodes, then idle nodes",
            ),
            SimPolicy(
                POLICY_GPU_CLUSTERING,
                POLICY_GPU_CLUSTERING,
                True,
                "order",
                "03-GpuClustering",
                "paper baseline: nodes already holding the pod's GPU-request class",
            ),
            SimPolicy(
                POLICY_RANDOM_FIT,
                POLICY_RANDOM_FIT,
                True,
                "random",
                "01-Random",
                "paper baseline: any feasible node, any fitting GPU",
            ),
        )
    }
)
"""Every policy ``infergrid simulate --policies`` accepts, by name."""


def sim_policy(name: str) -> SimPolicy:
    """The simulator policy called ``name``; an unknown name fails here, before any replay."""
    try:
        return SIM_POLICIES[name]
    except KeyError:
        known = ", ".join(SIM_POLICIES)
        raise ContractError("policies", f"{name!r} is not one of {known}") from None


def parse_policies(text: str) -> tuple[SimPolicy, ...]:
    """Comma-separated policy names, or ``all``; each once, in the order given."""
    names = list(SIM_POLICIES) if text.strip() == "all" else text.split(",")
    chosen: dict[str, SimPolicy] = {}
    for name in (n.strip() for n in names):
        if not name:
            raise ContractError("policies", f"empty name in {text!r}")
        chosen.setdefault(name, sim_policy(name))
    return tuple(chosen.values())


def typical_workload(
    pods: Iterable[TracePod], coverage: float = TYPICAL_COVERAGE, step: int = TYPICAL_STEP
) -> Workload:
    """The paper's typical pods M as a core workload: shapes (CPU, GPU milli, GPU count, models)
    most frequent first, taken ``step`` at a time until they cover ``coverage`` of the pods,
    CPU-only pods included; popularity renormalised to 1. Equal counts rank the smaller
    shape first. On the default trace that is 40 shapes (96.6% of pods), the last of them
    the 8-GPU pod whose popularity keeps fgd from breaking up idle 8-GPU nodes."""
    counts = Counter((p.num_gpu, p.gpu_milli, p.cpu_milli, p.gpu_spec) for p in pods)
    ranked = sorted(counts.items(), key=lambda kc: (-kc[1], kc[0][:3], sorted(kc[0][3])))
    return _typical([(_demand(*shape), count) for shape, count in ranked], coverage, step)


def typical_demands(
    demands: Iterable[Demand], coverage: float = TYPICAL_COVERAGE, step: int = TYPICAL_STEP
) -> Workload:
    """``typical_workload`` of pods already in the core's demands (a live cluster's, one per
    GPU container): the same selection, equal counts ranking the smaller demand first
    (GPUs, memory, SMs, CPU, models), which is the trace shapes' order for GPU pods."""
    counts = Counter(demands)
    ranked = sorted(
        counts.items(),
        key=lambda dc: (
            -dc[1],
            (dc[0].whole_gpus, dc[0].memory_mib, dc[0].cores, dc[0].cpu_milli),
            sorted(dc[0].gpu_models),
        ),
    )
    return _typical(ranked, coverage, step)


def _typical(ranked: Sequence[tuple[Demand, int]], coverage: float, step: int) -> Workload:
    """The first ``step``, 2 × ``step``, ... of the ranked demands, until they cover
    ``coverage`` of the pods."""
    if not ranked:
        raise ContractError("pods", "no pods to take typical shapes from")
    total = sum(count for _, count in ranked)
    taken = step
    while sum(count for _, count in ranked[:taken]) < coverage * total:
        taken += step
    return Workload.of((demand, float(count)) for demand, count in ranked[:taken])


def _demand(num_gpu: int, gpu_milli: int, cpu_milli: int, spec: frozenset[str]) -> Demand:
    if num_gpu == 0:
        # Fragment to a CPU-only pod is all idle GPU whatever its CPU; keep it valid.
        return Demand(cpu_milli=max(cpu_milli, 1), gpu_models=spec)
    if gpu_milli >= MILLI_GPU:
        return Demand(whole_gpus=num_gpu, cpu_milli=cpu_milli, gpu_models=spec)
    memory, cores = share_of(gpu_milli)
    return Demand(memory_mib=memory, cores=cores, cpu_milli=cpu_milli, gpu_models=spec)
