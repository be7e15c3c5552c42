"""What a report holds: a row per namespace, service and GPU model, a total, and the fleet's GPUs
at each step. Every renderer reads these and nothing else."""

from __future__ import annotations

from dataclasses import dataclass

from infergrid.report.prices import PriceTable

NO_SERVICE = "-"  # a pod holding a GPU with no engine series: no InferenceService known
NO_GPU = "-"  # an engine pod that held no GPU (a CPU-only service)


@dataclass(frozen=True, slots=True)
class Row:
    """GPU-hours and tokens of one group of pods over the window.

    ``held_gpu_hours``: the fractions of GPUs held, over time. ``whole_gpu_hours``: what the
    same pods would have held with whole GPUs only. ``measured_gpu_hours``: the held GPU-hours
    on GPUs whose utilisation was read, and ``used_gpu_hours`` those times utilisation (so
    utilisation is over what was measured; a MIG instance's GPU reports none).
    ``price_per_gpu_hour`` is None on the total, which mixes models.
    """

    namespace: str
    service: str
    model: str
    pods: int
    held_gpu_hours: float
    whole_gpu_hours: float
    measured_gpu_hours: float
    used_gpu_hours: float
    tokens: float
    price_per_gpu_hour: float | None
    cost_held: float
    cost_whole: float

    @property
    def utilization_pct(self) -> float | None:
        if self.measured_gpu_hours <= 0:
            return None
        return 100 * self.used_gpu_hours / self.measured_gpu_hours

    @property
    def tokens_per_gpu_hour(self) -> float | None:
        return self.tokens / self.held_gpu_hours if self.held_gpu_hours > 0 else None

    @property
    def saved_gpu_hours(self) -> float:
        """What sharing saved against whole GPUs."""
        return self.whole_gpu_hours - self.held_gpu_hours

    @property
    def saved_pct(self) -> float | None:
        return (
            100 * self.saved_gpu_hours / self.whole_gpu_hours if self.whole_gpu_hours > 0 else None
        )

    @property
    def saved_cost(self) -> float:
        return self.cost_whole - self.cost_held


@dataclass(frozen=True, slots=True)
class Point:
    """The fleet at one step: GPUs held (the sum of fractions), GPUs whole-GPU allocation would
    hold, GPUs' worth in use, and the GPUs held where utilisation was read."""

    time: float
    held_gpus: float
    whole_gpus: float
    used_gpus: float
    measured_gpus: float

    @property
    def utilization_pct(self) -> float | None:
        return 100 * self.used_gpus / self.measured_gpus if self.measured_gpus > 0 else None


@dataclass(frozen=True, slots=True)
class Report:
    """The report over the window [start, end) read every ``step`` seconds: rows sorted by
    namespace, service and model, their total, the fleet at each step, and the prices used."""

    start: float
    end: float
    step: float
    rows: tuple[Row, ...]
    total: Row
    timeline: tuple[Point, ...]
    prices: PriceTable
