"""fgd-cluster-aware: FGD, plus the three things it ignores that decide packing on openb.

The score of a placement, higher is better, in whole GPUs:

    ⌊(ΔF − STRAND_WEIGHT · Δstranded − CONTENTION_WEIGHT · contested) / RESOLUTION⌋

* ΔF is FGD's: the decrease of node fragmentation over the typical pods.
* Stranded GPUs are free GPU capacity that the node's free CPU cannot feed:
  max(0, free GPUs − free CPU ÷ c), c the CPU to keep beside each free GPU
  (``cpu_to_keep``): what the workload's typical GPU pod brings per GPU. FGD
  sees CPU only where a typical pod stops fitting, so it will spend the CPU of
  a node with idle GPUs on a CPU-only pod; this prices it.
* Where CPU is short (``cpu_short``: the typical pods, CPU-only ones included,
  ask for more CPU per GPU than the cluster has, ``Workload.cluster_cpu_per_gpu``
  from ``with_cluster``), CPU, not GPUs, decides how much gets placed, and a GPU
  is only as usable as the CPU left beside it for the whole workload: c also
  counts what the CPU-only pods bring per GPU. GPU pods then go first to nodes
  short of CPU, whose GPUs would be stranded anyway, and CPU-rich nodes keep
  their CPU for the CPU-only pods. (On the openb trace only cpu250, where a
  quarter of the pods are CPU-only, is short. Counting the CPU-only pods also
  where CPU is not short, even in part, cost up to 1.6 pp on gpuspec33.)
* Contested is the GPUs the pod takes times how contested their model is
  (``Workload.contention``, from ``model_contention``): pods that run anywhere
  keep off the models that pods restricted by ``gpu_spec`` need. FGD sees a
  model only where a restricted pod stops fitting, which is too late.
* Scores are counted in steps of RESOLUTION GPUs: placements within a step are
  equal, and the pick takes the first of them in node order, which packs like
  first-fit. FGD's exact scores spread pods over nodes that differ by noise.

Ties among placements that take no GPU (CPU-only pods) go to the node left with
the most CPU to spare beyond what its free GPUs need; where CPU is short, first,
as binpack's do, to the node with the fewest free GPUs (CPU beside taken GPUs is
of no use to GPU pods). Nodes without ``host`` (the extender's) and workloads
without CPU or contention reduce it to a quantised fgd.
"""

import math
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Final

import numpy as np

from infergrid.placement.fragmentation import (
    Workload,
    fragmentation_before,
    free_capacity,
    node_fragmentation,
)
from infergrid.placement.fragmentation_rows import (
    Floats,
    NodeRows,
    RowPlan,
    fragmentation,
    running_sum,
)
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

_FREE_GPU_WEIGHT: Final = 1e-2
"""Where CPU is short, the CPU-only tie-break's first key, per free GPU left on the node: a
node would need 100 free GPUs to lose a whole score step."""

_SHORT_TIE_WEIGHT: Final = 1e-7
"""Where CPU is short, scales the second key (spare CPU) so it stays under 1e-4, below the
first's."""


def cpu_asked_per_gpu(workload: Workload) -> tuple[float, float]:
    """Millicores the workload's GPU pods and its CPU-only pods bring per GPU it asks for,
    weighted by popularity (a share counts its SM fraction of a GPU); (0, 0) without GPU
    tasks."""
    gpu_pods = cpu_only = gpus = 0.0
    for demand, p in workload.tasks:
        if demand.wants_gpu:
            gpu_pods += p * demand.cpu_milli
            gpus += p * (demand.whole_gpus or demand.cores / ALL_CORES)
        else:
            cpu_only += p * demand.cpu_milli
    return (gpu_pods / gpus, cpu_only / gpus) if gpus > 0 else (0.0, 0.0)


def cpu_short(workload: Workload) -> bool:
    """Whether the workload asks for more CPU per GPU, its CPU-only pods' included, than the
    cluster it runs on has (``Workload.cluster_cpu_per_gpu``); False where that is not known."""
    return _cpu_plan(workload)[0]


def cpu_to_keep(workload: Workload) -> float:
    """Millicores to keep beside each free GPU: what the GPU pods bring per GPU, and, where
    CPU is short (``cpu_short``), what the CPU-only pods bring per GPU as well."""
    return _cpu_plan(workload)[1]


def _cpu_plan(workload: Workload) -> tuple[bool, float]:
    """``cpu_short`` and ``cpu_to_keep`` from one pass over the tasks, as every score needs
    both."""
    own, cpu_only = cpu_asked_per_gpu(workload)
    cluster = workload.cluster_cpu_per_gpu
    short = cluster > 0 and own + cpu_only > cluster
    return short, own + cpu_only if short else own


def free_gpus(node: NodeState) -> float:
    """Unallocated GPU capacity of the node, in GPUs."""
    return sum(free_capacity(g) for g in node.gpus)


def stranded_gpus(node: NodeState, per_gpu: float, free: float | None = None) -> float:
    """Free GPUs the node's free CPU cannot feed at ``per_gpu`` millicores each; ``free`` is
    ``free_gpus(node)`` where the caller has it."""
    if node.host is None or per_gpu <= 0:
        return 0.0
    free = free_gpus(node) if free is None else free
    return max(0.0, free - node.host.free_cpu_milli / per_gpu)


def spare_cpu(node: NodeState, per_gpu: float, free: float | None = None) -> float:
    """CPU beyond what the node's free GPUs need, in GPUs' worth at ``per_gpu``; ``free`` as
    for ``stranded_gpus``."""
    if node.host is None or per_gpu <= 0:
        return 0.0
    free = free_gpus(node) if free is None else free
    return max(0.0, node.host.free_cpu_milli / per_gpu - free)


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


def with_cluster(
    workload: Workload, gpus_per_model: Mapping[str, int], cpu_milli: int = 0
) -> Workload:
    """``workload`` carrying what fgd-cluster-aware reads of the cluster it runs on: how contested
    each model is, given the GPUs of each, and the cluster's CPU per GPU (``cpu_milli`` in
    all; 0: not known)."""
    contention = model_contention(workload, gpus_per_model)
    gpus = sum(n for n in gpus_per_model.values() if n > 0)
    per_gpu = cpu_milli / gpus if gpus > 0 else 0.0
    return replace(workload, contention=MappingProxyType(contention), cluster_cpu_per_gpu=per_gpu)


def fgd_cluster_aware_score(before: NodeState, after: NodeState, workload: Workload) -> float:
    """fgd-cluster-aware (see the module): quantised FGD, less stranded GPUs, contested models."""
    short, per_gpu = _cpu_plan(workload)
    decrease = fragmentation_before(before, workload) - node_fragmentation(after, workload)
    # Each summed once: the simulator scores millions of placements.
    free_before, free_after = free_gpus(before), free_gpus(after)
    stranded = stranded_gpus(after, per_gpu, free_after) - stranded_gpus(
        before, per_gpu, free_before
    )
    taken = free_before - free_after
    contested = workload.contention.get(before.product, 0.0) * taken
    value = decrease - STRAND_WEIGHT * stranded - CONTENTION_WEIGHT * contested
    score = float(math.floor(value / RESOLUTION + 1e-9))
    if taken <= 0:
        spare = min(spare_cpu(after, per_gpu, free_after), _TIE_CAP)
        if short:
            score += _SHORT_TIE_WEIGHT * spare - _FREE_GPU_WEIGHT * free_after
        else:
            score += _TIE_WEIGHT * spare
    return score


def fgd_cluster_aware_rows(
    before: NodeRows, after: NodeRows, plan: RowPlan, workload: Workload
) -> Floats:
    """``fgd_cluster_aware_score`` of each row, the same arithmetic in the same order, so the
    extender's index and the simulator's exact core give equal floats."""
    short, per_gpu = _cpu_plan(workload)
    decrease = fragmentation(before.gpus, before.hosts, plan) - fragmentation(
        after.gpus, after.hosts, plan
    )
    free_before, free_after = running_sum(before.gpus.free), running_sum(after.gpus.free)
    stranded = _stranded_rows(after, free_after, per_gpu) - _stranded_rows(
        before, free_before, per_gpu
    )
    taken = free_before - free_after
    contested = plan.contention[before.hosts.product] * taken
    value = decrease - STRAND_WEIGHT * stranded - CONTENTION_WEIGHT * contested
    score = np.floor(value / RESOLUTION + 1e-9)
    idle = taken <= 0
    if not idle.any():
        return score
    spare = np.minimum(_spare_rows(after, free_after, per_gpu), _TIE_CAP)
    if short:
        tie = _SHORT_TIE_WEIGHT * spare - _FREE_GPU_WEIGHT * free_after
    else:
        tie = _TIE_WEIGHT * spare
    return np.where(idle, score + tie, score)


def _stranded_rows(nodes: NodeRows, free: Floats, per_gpu: float) -> Floats:
    """``stranded_gpus`` of each row, given its free GPUs."""
    if per_gpu <= 0:
        return np.zeros(len(free))
    hosts = nodes.hosts
    return np.where(hosts.tracked, np.maximum(0.0, free - hosts.free_cpu / per_gpu), 0.0)


def _spare_rows(nodes: NodeRows, free: Floats, per_gpu: float) -> Floats:
    """``spare_cpu`` of each row, given its free GPUs."""
    if per_gpu <= 0:
        return np.zeros(len(free))
    hosts = nodes.hosts
    return np.where(hosts.tracked, np.maximum(0.0, hosts.free_cpu / per_gpu - free), 0.0)
