"""How many replicas a service needs: the HPA's rule, with a warm pool, as a pure function.

Each metric gives a ratio, observed / target. The largest ratio times the
pods that reported it is the load, in replicas working at target; the
replicas needed are that, rounded up, plus the warm pool of ready spares.
A load within the tolerance of what the serving replicas carry changes
nothing.

Requests the gateway holds for the service (it holds them while no pod is
ready) are demand too: they add to the queue depth's load as that many more
queued requests would, and the replicas needed are at least
ceil(pending / targetQueueDepth), so at least one while any request waits,
even when no pod reports (none runs, at minReplicas 0). So a service idles
down to minReplicas 0 once its engines report no load for a window, and
comes back up on its first request.

Scaling up happens at once. Scaling down waits until every
recommendation within the stabilisation window is lower (the window's
highest one wins, as in the HPA), and then removes at most
scaleDownMaxPercent of the replicas in one step (at least one). The
recommendation history is plain data that the caller keeps and passes back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .metrics_scrape import ServiceMetrics
from .spec import Autoscaling

# (time in seconds, recommended replicas), oldest first.
History = tuple[tuple[float, int], ...]


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """An InferenceService's autoscaling spec as the numbers the rule uses (fractions, seconds)."""

    min_replicas: int
    max_replicas: int
    tolerance: float = 0.1
    stabilization_s: float = 300.0
    scale_down_max_percent: int = 20
    warm_pool: int = 0
    target_queue_depth: int = Autoscaling().target_queue_depth  # requests per replica

    @classmethod
    def from_spec(cls, spec: Autoscaling) -> ScalingPolicy:
        return cls(
            min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas,
            tolerance=spec.tolerance_percent / 100,
            stabilization_s=spec.scale_down_stabilization_s,
            scale_down_max_percent=spec.scale_down_max_percent,
            warm_pool=spec.warm_pool,
            target_queue_depth=spec.target_queue_depth,
        )


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    """One tick's outcome: the replica count to set, and what the next tick decides from."""

    replicas: int  # what spec.replicas should be now
    recommendation: int  # what the metrics alone ask for
    history: History  # to pass to the next call
    reason: str


QUEUE_DEPTH = "queueDepth"


def ratios(metrics: ServiceMetrics, spec: Autoscaling) -> dict[str, float]:
    """Observed / target per metric the pods export."""
    pairs = {
        QUEUE_DEPTH: (metrics.queue_depth, spec.target_queue_depth),
        "p99LatencyMs": (metrics.p99_latency_ms, spec.target_p99_latency_ms),
        "gpuUtilization": (metrics.gpu_utilization, spec.target_gpu_utilization),
    }
    return {name: value / target for name, (value, target) in pairs.items() if value is not None}


def recommend(
    current: int,
    reporting: int,
    metric_ratios: Mapping[str, float],
    policy: ScalingPolicy,
    pending: float = 0,
) -> int:
    """Replicas the metrics and the gateway's `pending` requests ask for, warm pool included,
    within min/max.

    `reporting` pods exported the metrics; with none (all starting, or none
    exporting) there is no load signal and the serving count stands, raised to
    what the pending requests need.
    """
    serving = max(current - policy.warm_pool, 0)
    held = pending / policy.target_queue_depth  # replicas the held requests would keep busy
    needed = serving
    if reporting and metric_ratios:
        loads = {name: reporting * ratio for name, ratio in metric_ratios.items()}
        loads[QUEUE_DEPTH] = loads.get(QUEUE_DEPTH, 0.0) + held
        load = max(loads.values())
        near = serving > 0 and abs(load / serving - 1) <= policy.tolerance
        needed = serving if near else math.ceil(round(load, 6))
    needed = max(needed, math.ceil(round(held, 6)))
    return _clamp(needed + policy.warm_pool, policy)


def desired_replicas(
    current: int,
    reporting: int,
    metric_ratios: Mapping[str, float],
    policy: ScalingPolicy,
    history: History,
    now: float,
    pending: float = 0,
) -> ScaleDecision:
    """The next replica count, and the history to keep for the next call.

    An empty history counts as the current count recommended now, so an
    operator that restarts waits a whole window before it scales down.
    """
    recommendation = recommend(current, reporting, metric_ratios, policy, pending)
    seed = history or ((now, current),)
    kept = tuple((t, r) for t, r in seed if t > now - policy.stabilization_s)
    history = (*kept, (now, recommendation))
    reason = _reason(metric_ratios, pending)
    if not policy.min_replicas <= current <= policy.max_replicas:
        return ScaleDecision(_clamp(current, policy), recommendation, history, "outside min..max")
    if recommendation >= current:
        return ScaleDecision(recommendation, recommendation, history, reason)
    stabilized = max(r for _, r in history)
    step = max(1, current * policy.scale_down_max_percent // 100)
    replicas = _clamp(max(stabilized, current - step), policy)
    return ScaleDecision(min(replicas, current), recommendation, history, reason)


def history_after(history: History, last_set: int | None, current: int) -> History:
    """The history to decide on when the count is no longer the one the autoscaler last set:
    someone scaled by hand (kubectl scale), and that count starts a new window, as after a
    restart, so a hand-set count holds for a window before any scale-down."""
    return history if last_set is None or last_set == current else ()


def _clamp(replicas: int, policy: ScalingPolicy) -> int:
    return min(max(replicas, policy.min_replicas), policy.max_replicas)


def _reason(metric_ratios: Mapping[str, float], pending: float) -> str:
    held = f"{pending:g} requests pending at the gateway" if pending else ""
    if not metric_ratios:
        return held or "no metrics"
    name = max(metric_ratios, key=lambda k: metric_ratios[k])
    ratio = f"{name} at {metric_ratios[name]:.2f}x target"
    return f"{ratio}, {held}" if held else ratio
