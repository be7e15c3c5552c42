"""fgd-plus: FGD, plus the three things it ignores that decide packing on the openb trace.

The score of a placement, higher is better, in whole GPUs:

    ⌊(ΔF − STRAND_WEIGHT · Δstranded − CONTENTION_WEIGHT · contested) / RESOLUTION⌋

* ΔF is FGD's: the decrease of node fragmentation over the typical pods.
* Stranded GPUs are free GPU capacity that the node's free CPU cannot feed:
  max(0, free GPUs − free CPU ÷ c), c the CPU the workload's typical GPU pod
  brings per GPU. FGD sees CPU only where a typical pod stops fitting, so it
  will spend the CPU of a node with idle GPUs on a CPU-only pod; this prices it.
* Contested is the GPUs the pod takes times how contested their model is
  (``Workload.contention``, from ``model_contention``): pods that run anywhere
  keep off the models that pods restricted by ``gpu_spec`` need. FGD sees a
  model only where a restricted pod stops fitting, which is too late.
* Scores are counted in steps of RESOLUTION GPUs: placements within a step are
  equal, and the pick takes the first of them in node order, which packs like
  first-fit. FGD's exact scores spread pods over nodes that differ by noise.

Ties among placements that take no GPU (CPU-only pods) go to the node left with
the most CPU to spare beyond what its free GPUs need. Nodes without ``host``
(the extender's) and workloads without CPU or contention reduce it to a
quantised fgd.
"""

import math
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Final

from infergrid.placement.fragmentation import Workload, free_capacity, node_fragmentation
from infergrid.placement.state import ALL_CORES, NodeState

RESOLUTION: Final = 0.04
"""Scores are compared in steps of this many GPUs (about one step of the paper's 0–100
sigmoid near zero)."""

STRAND_WEIGHT: Final = 1.0
"""A GPU stranded by lack of CPU counts as much as a GPU of fragment."""

CONTENTION_WEIGHT: Final = 1.0
"""A GPU taken from a model twice as contested as the average costs one GPU of fragment."""

_TIE_WEIGHT: Final = 1e-5
"""Scales the CPU-only tie-break (spare CPU, in GPUs fed) far below one score step."""

_TIE_CAP: Final = 1000.0
"""Spare CPU counts up to this many GPUs' worth, so the tie-break stays under 0.01."""


def cpu_per_gpu(workload: Workload) -> float:
    """Millicores the workload's typical GPU pod brings per GPU (a share counts its SM
    fraction); 0 when its tasks carry no CPU."""
    cpu = gpus = 0.0
    for demand, p in workload.tasks:
        if demand.wants_gpu:
            cpu += p * demand.cpu_milli
            gpus += p * (demand.whole_gpus or demand.cores / ALL_CORES)
    return cpu / gpus if gpus > 0 else 0.0


def free_gpus(node: NodeState) -> float:
    """Unallocated GPU capacity of the node, in GPUs."""
    return sum(free_capacity(g) for g in node.gpus)


def stranded_gpus(node: NodeState, per_gpu: float) -> float:
    """Free GPUs the node's free CPU cannot feed at ``per_gpu`` millicores each."""
    if node.host is None or per_gpu <= 0:
        return 0.0
    return max(0.0, free_gpus(node) - node.host.free_cpu_milli / per_gpu)


def spare_cpu(node: NodeState, per_gpu: float) -> float:
    """CPU beyond what the node's free GPUs need, in GPUs' worth at ``per_gpu``."""
    if node.host is None or per_gpu <= 0:
        return 0.0
    return max(0.0, node.host.free_cpu_milli / per_gpu - free_gpus(node))


def model_contention(workload: Workload, gpus_per_model: Mapping[str, int]) -> dict[str, float]:
    """How contested each GPU model is, relative to the cluster: 0 on average.

    Each typical GPU task's demand (popularity × GPUs) is spread over the models
    it accepts in proportion to their GPUs; a model's contention is its demand
    per GPU over the cluster's, less 1. Without ``gpu_models`` on any task every
    model gets 0; a model only restricted tasks want gets more.
    """
    capacity = {m: n for m, n in gpus_per_model.items() if n > 0}
    total = sum(capacity.values())
    load = dict.fromkeys(capacity, 0.0)
    for demand, p in workload.tasks:
        if not demand.wants_gpu:
            continue
        accepted = [m for m in capacity if not demand.gpu_models or m in demand.gpu_models]
        room = sum(capacity[m] for m in accepted)
        asked = p * (demand.whole_gpus or demand.cores / ALL_CORES)
        for model in accepted:
            load[model] += asked * capacity[model] / room
    mean = sum(load.values()) / total if total else 0.0
    if mean <= 0:
        return dict.fromkeys(capacity, 0.0)
    return {m: load[m] / capacity[m] / mean - 1.0 for m in capacity}


def with_contention(workload: Workload, gpus_per_model: Mapping[str, int]) -> Workload:
    """``workload`` carrying the contention of each model of a cluster with these GPUs."""
    contention = model_contention(workload, gpus_per_model)
    return replace(workload, contention=MappingProxyType(contention))


def fgd_plus_score(before: NodeState, after: NodeState, workload: Workload) -> float:
    """fgd-plus (see the module): quantised FGD, less stranded GPUs and contested models."""
    per_gpu = cpu_per_gpu(workload)
    decrease = node_fragmentation(before, workload) - node_fragmentation(after, workload)
    stranded = stranded_gpus(after, per_gpu) - stranded_gpus(before, per_gpu)
    taken = free_gpus(before) - free_gpus(after)
    contested = workload.contention.get(before.product, 0.0) * taken
    value = decrease - STRAND_WEIGHT * stranded - CONTENTION_WEIGHT * contested
    score = float(math.floor(value / RESOLUTION + 1e-9))
    if taken <= 0:
        score += _TIE_WEIGHT * min(spare_cpu(after, per_gpu), _TIE_CAP)
    return score
