"""The paper's metrics, from the measurements a replay takes after every pod.

After each pod (placed or failed) the replay records the arrived workload, the
allocated GPUs, the fragmentation and the failed pods so far. Definitions (the
README of ``shared/traces/openb``, "Metric definitions"):

* arrived workload % = 100 × GPU request of every pod so far (failed ones too)
  ÷ the cluster's GPU milli; measurements are binned by it rounded to an integer;
* unallocated GPU % = 100 − 100 × allocated GPU milli ÷ the cluster's; at k%
  arrived it is the mean over the measurements in bin k (as the paper's
  analysis; an empty bin takes bins k−1..k+1);
* fragmentation rate % = 100 × Σ_n F_n ÷ Σ_n idle(n), F_n over the typical
  pods (``node_fragmentation``), idle(n) the node's unallocated GPU milli
  (``node_fragment`` gives both, ``fragmentation_rate`` the ratio); binned the
  same way;
* failed pods at k% = pods that found no node among those arrived by the end
  of bin k.

Across seeds each value is summarised by mean, median and standard deviation.
"""

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from infergrid.placement import NodeState, Workload, free_capacity, node_fragmentation
from infergrid.simulate.trace import MILLI_GPU

LAST_BIN: Final = 130
"""Bins run from 0 to 130% arrived, the paper's x axis."""

DEFAULT_CHECKPOINTS: Final = (90, 95, 100, 110, 130)


@dataclass(frozen=True, slots=True)
class Measurement:
    """The cluster after one pod: arrived and allocated % of the GPUs, fragmentation rate %,
    and failed pods so far."""

    arrived_pct: float
    allocated_pct: float
    frag_rate_pct: float
    failed: int


@dataclass(frozen=True, slots=True)
class Curves:
    """One run's binned metrics, bin (arrived %, an integer) → value; bins without data absent."""

    unallocated_pct: Mapping[int, float]
    frag_rate_pct: Mapping[int, float]
    failed_pods: Mapping[int, int]


@dataclass(frozen=True, slots=True)
class Spread:
    """A value across seeds."""

    mean: float
    median: float
    sd: float

    @staticmethod
    def of(values: Sequence[float]) -> "Spread":
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return Spread(statistics.fmean(values), statistics.median(values), sd)


def node_fragment(node: NodeState, workload: Workload) -> tuple[float, float]:
    """(F_n, idle(n)) of the node in milli-GPUs, F_n over the typical pods ``workload``."""
    return (
        node_fragmentation(node, workload) * MILLI_GPU,
        sum(free_capacity(g) for g in node.gpus) * MILLI_GPU,
    )


def fragmentation_rate(fragment: float, idle: float) -> float:
    """100 × Σ F_n ÷ Σ idle(n) (each summed over the nodes); 0 with nothing idle."""
    return 100.0 * fragment / idle if idle > 0 else 0.0


def arrival_bin(arrived_pct: float) -> int:
    """The bin of a measurement: arrived % rounded half to even, as the paper's pandas does."""
    return round(arrived_pct)


def binned_mean(points: Sequence[tuple[float, float]], last: int = LAST_BIN) -> dict[int, float]:
    """(arrived %, value) points → bin → mean value, for bins 0..``last`` that have data."""
    bins: dict[int, list[float]] = {}
    for arrived, value in points:
        bins.setdefault(arrival_bin(arrived), []).append(value)
    out: dict[int, float] = {}
    for k in range(last + 1):
        values = bins.get(k) or [v for j in (k - 1, k + 1) for v in bins.get(j, ())]
        if values:
            out[k] = statistics.fmean(values)
    return out


def curves(measurements: Sequence[Measurement], last: int = LAST_BIN) -> Curves:
    """Bin one run's measurements into the paper's curves."""
    allocated = binned_mean([(m.arrived_pct, m.allocated_pct) for m in measurements], last)
    frag = binned_mean([(m.arrived_pct, m.frag_rate_pct) for m in measurements], last)
    failed: dict[int, int] = {}
    for m in measurements:  # in arrival order, so the last one of each bin wins
        failed[arrival_bin(m.arrived_pct)] = m.failed
    so_far = 0
    failed_by: dict[int, int] = {}
    for k in range(last + 1):
        so_far = failed.get(k, so_far)
        failed_by[k] = so_far
    return Curves({k: 100.0 - v for k, v in allocated.items()}, frag, failed_by)


def spread_at(runs: Sequence[Curves], metric: str, k: int) -> Spread | None:
    """The spread across runs of ``metric`` (a ``Curves`` field) at bin ``k``; None if a run
    has no value there."""
    values = [getattr(run, metric).get(k) for run in runs]
    if not values or any(v is None for v in values):
        return None
    return Spread.of([float(v) for v in values if v is not None])
