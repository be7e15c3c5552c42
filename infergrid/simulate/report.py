"""What a simulation prints: a table, a JSON document in a stable schema, and a PNG.

JSON schema ``infergrid.io/simulate/v1`` (keys are stable; numbers are floats
rounded to 4 decimals; a value a run lacks is null):

    {
      "schema": "infergrid.io/simulate/v1",
      "trace": {"nodes": path, "pods": path, "node_count": int, "gpus": int,
                "pod_count": int, "gpu_request_pct": float},
      "protocol": {"seeds": [int], "inflation": float, "checkpoints_pct": [int]},
      "policies": [{
        "name": str, "summary": str, "paper": str | null,
        "checkpoints": [{"arrived_pct": int,
                         "unallocated_gpu_pct": {"mean", "median", "sd"},
                         "fragmentation_rate_pct": {"mean", "median", "sd"},
                         "failed_pods": {"mean", "median", "sd"}}],
        "runs": [{"seed": int, "pods": int, "failed_pods": int, "seconds": float,
                  "checkpoints": [{"arrived_pct": int, "unallocated_gpu_pct": float,
                                   "fragmentation_rate_pct": float, "failed_pods": int}]}],
        "curve": [{"arrived_pct": int, "unallocated_gpu_pct_median": float}]
      }]
    }

``checkpoints`` summarise the runs across seeds; ``curve`` is the median
unallocated % at every arrived % from 0 to 130 (what the PNG draws);
``failed_pods`` of a run is over its whole replay, to 130% arrived.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from infergrid.errors import ContractError
from infergrid.simulate.metrics import LAST_BIN, Spread, spread_at
from infergrid.simulate.policies import SimPolicy
from infergrid.simulate.replay import RunResult

SCHEMA: Final = "infergrid.io/simulate/v1"
_DIGITS: Final = 4
_METRICS: Final = (
    ("unallocated_gpu_pct", "unallocated_pct"),
    ("fragmentation_rate_pct", "frag_rate_pct"),
    ("failed_pods", "failed_pods"),
)


@dataclass(frozen=True, slots=True)
class TraceInfo:
    """What the report says about the input."""

    nodes: str
    pods: str
    node_count: int
    gpus: int
    pod_count: int
    gpu_request_pct: float


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """Every run of one policy, in seed order."""

    policy: SimPolicy
    runs: tuple[RunResult, ...]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, _DIGITS)


def _spread(spread: Spread | None) -> dict[str, float | None]:
    if spread is None:
        return {"mean": None, "median": None, "sd": None}
    return {"mean": _round(spread.mean), "median": _round(spread.median), "sd": _round(spread.sd)}


def median_curve(result: PolicyResult, metric: str = "unallocated_pct") -> dict[int, float]:
    """Bin → median over the runs, for every bin all runs have."""
    curves = [r.curves for r in result.runs]
    out: dict[int, float] = {}
    for k in range(LAST_BIN + 1):
        spread = spread_at(curves, metric, k)
        if spread is not None:
            out[k] = spread.median
    return out


def to_json(
    trace: TraceInfo,
    seeds: Sequence[int],
    inflation: float,
    checkpoints: Sequence[int],
    results: Sequence[PolicyResult],
) -> dict[str, Any]:
    """The whole simulation as the documented JSON document."""
    return {
        "schema": SCHEMA,
        "trace": {
            "nodes": trace.nodes,
            "pods": trace.pods,
            "node_count": trace.node_count,
            "gpus": trace.gpus,
            "pod_count": trace.pod_count,
            "gpu_request_pct": _round(trace.gpu_request_pct),
        },
        "protocol": {
            "seeds": list(seeds),
            "inflation": inflation,
            "checkpoints_pct": list(checkpoints),
        },
        "policies": [_policy_json(r, checkpoints) for r in results],
    }


def _policy_json(result: PolicyResult, checkpoints: Sequence[int]) -> dict[str, Any]:
    curves = [r.curves for r in result.runs]
    return {
        "name": result.policy.name,
        "summary": result.policy.summary,
        "paper": result.policy.paper,
        "checkpoints": [
            {
                "arrived_pct": k,
                **{key: _spread(spread_at(curves, field, k)) for key, field in _METRICS},
            }
            for k in checkpoints
        ],
        "runs": [
            {
                "seed": run.seed,
                "pods": run.pods,
                "failed_pods": run.failed_pods,
                "seconds": _round(run.seconds),
                "checkpoints": [
                    {
                        "arrived_pct": k,
                        "unallocated_gpu_pct": _round(run.curves.unallocated_pct.get(k)),
                        "fragmentation_rate_pct": _round(run.curves.frag_rate_pct.get(k)),
                        "failed_pods": run.curves.failed_pods.get(k),
                    }
                    for k in checkpoints
                ],
            }
            for run in result.runs
        ],
        "curve": [
            {"arrived_pct": k, "unallocated_gpu_pct_median": _round(v)}
            for k, v in sorted(median_curve(result).items())
        ],
    }


def dumps(document: dict[str, Any]) -> str:
    """The JSON text: two-space indent, keys in schema order."""
    return json.dumps(document, indent=2)


def table(results: Sequence[PolicyResult], checkpoints: Sequence[int]) -> str:
    """A plain-text table: median unallocated GPU % at each checkpoint, then mean at 100%,
    median fragmentation rate at 100%, median failed pods and seconds per run."""
    head = [
        "POLICY",
        *(f"@{k}%" for k in checkpoints),
        "MEAN@100%",
        "FRAG@100%",
        "FAILED",
        "S/RUN",
    ]
    rows = [head]
    for result in results:
        curves = [r.curves for r in result.runs]
        cells = [result.policy.name]
        for k in checkpoints:
            cells.append(_cell(spread_at(curves, "unallocated_pct", k), "median"))
        cells.append(_cell(spread_at(curves, "unallocated_pct", 100), "mean"))
        cells.append(_cell(spread_at(curves, "frag_rate_pct", 100), "median", 1))
        failed = Spread.of([float(r.failed_pods) for r in result.runs])
        cells.append(f"{failed.median:.0f}")
        seconds = Spread.of([r.seconds for r in result.runs])
        cells.append(f"{seconds.mean:.1f}")
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    note = "unallocated GPU % (median over seeds); FAILED: median failed pods to 130% arrived"
    return "\n".join([*(line.rstrip() for line in lines), note])


def _cell(spread: Spread | None, which: str, digits: int = 2) -> str:
    return "-" if spread is None else f"{getattr(spread, which):.{digits}f}"


def write_png(path: str | Path, results: Sequence[PolicyResult], title: str) -> None:
    """Unallocated GPU % (median over seeds) against arrived workload, a line per policy."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise ContractError("png", "needs matplotlib: pip install 'infergrid[simulate]'") from None
    figure, axes = pyplot.subplots(figsize=(8, 5), dpi=120)
    ideal = list(range(LAST_BIN + 1))
    axes.plot(
        ideal, [max(0, 100 - x) for x in ideal], "k:", linewidth=1, label="ideal: max(0, 100 − x)"
    )
    for result in results:
        curve = median_curve(result)
        axes.plot(list(curve), list(curve.values()), linewidth=1.5, label=result.policy.name)
    axes.set_xlim(0, LAST_BIN)
    axes.set_ylim(0, 100)
    axes.set_xlabel("arrived workload (% of cluster GPUs)")
    axes.set_ylabel("unallocated GPUs (%), median over seeds")
    axes.set_title(title)
    axes.grid(True, linewidth=0.3)
    axes.legend(fontsize=8, loc="lower left")
    inset = axes.inset_axes((0.55, 0.42, 0.42, 0.33))
    for result in results:
        curve = {k: v for k, v in median_curve(result).items() if k >= 85}
        inset.plot(list(curve), list(curve.values()), linewidth=1.2)
    inset.set_title("85–130%", fontsize=8)
    inset.tick_params(labelsize=7)
    inset.grid(True, linewidth=0.3)
    try:
        figure.savefig(path)
    except OSError as error:
        raise ContractError("png", f"cannot write {path}: {error.strerror or error}") from None
    finally:
        pyplot.close(figure)
