"""Packing quality on the FGD paper's openb trace: our simulator's numbers beside the paper's.

Replays every trace of the paper's figures (default and 16 variants) under the
paper's six policies (our replicas: fgd-paper, best-fit, dot-product,
gpu-packing, gpu-clustering, random-fit) and our fgd-plus, and on the default
trace also the extender's fgd, binpack and spread, on seeds 42-51, through the
same engine as ``infergrid simulate``. Then it prints, and writes to
bench/packing.md: the default trace's curve points, the reproduction check, the
fragmentation rate, every variant at 100% arrived, fgd-plus's reductions, and
the time per run; and draws bench/packing.png (default trace, median curves).

Runs are saved to --results as they finish, so an interrupted sweep resumes,
and --render-only redraws the tables from that file without replaying.

    .venv/bin/python bench/packing.py [--traces all|default,cpu250] [--seeds 42-51] [--jobs 2]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infergrid.simulate.cli import parse_seeds, simulate
from infergrid.simulate.metrics import LAST_BIN
from infergrid.simulate.policies import SIM_POLICIES, sim_policy
from infergrid.simulate.trace import load_nodes, load_pods

HERE = Path(__file__).resolve().parent
TRACE_DIR = HERE.parents[1] / "shared" / "traces" / "openb"
NODES = "openb_node_list_gpu_node.csv"
TRACES = (
    "default",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
)
OURS = "fgd-plus"
PAPER_POLICIES = (
    "fgd-paper",
    "best-fit",
    "dot-product",
    "gpu-packing",
    "gpu-clustering",
    "random-fit",
)
EXTENDER_POLICIES = ("fgd", "binpack", "spread")
CHECKPOINTS = (90, 95, 100, 110, 130)
FRAG_POINTS = (50, 80, 90)
MUST_MATCH = ("best-fit", "dot-product", "random-fit")
"""The issue's acceptance: these within 1 pp of the paper at 100% (median, default trace)."""


def policies_for(trace: str) -> tuple[str, ...]:
    extra = EXTENDER_POLICIES if trace == "default" else ()
    return (OURS, *PAPER_POLICIES, *extra)


# --- running ------------------------------------------------------------------------------


def sweep(traces: list[str], seeds: tuple[int, ...], jobs: int, store: dict[str, Any], path: Path):
    nodes = load_nodes(TRACE_DIR / NODES)
    for trace in traces:
        pods = load_pods(TRACE_DIR / f"openb_pod_list_{trace}.csv")
        for name in policies_for(trace):
            done = store.setdefault(trace, {}).setdefault(name, {})
            todo = [s for s in seeds if str(s) not in done]
            if not todo:
                continue
            started = time.perf_counter()
            (result,) = simulate(nodes, pods, [sim_policy(name)], todo, jobs=jobs, quiet=True)
            for run in result.runs:
                done[str(run.seed)] = _run_record(run, full=trace == "default")
            took = time.perf_counter() - started
            print(f"{trace:12s} {name:15s} {len(todo)} seeds in {took:6.1f} s", file=sys.stderr)
            path.write_text(json.dumps(store))


def _run_record(run, full: bool) -> dict[str, Any]:
    points = range(LAST_BIN + 1) if full else (*CHECKPOINTS, *FRAG_POINTS)
    curves = run.curves
    return {
        "pods": run.pods,
        "failed": run.failed_pods,
        "seconds": round(run.seconds, 3),
        "unalloc": _points(curves.unallocated_pct, points),
        "frag": _points(curves.frag_rate_pct, points),
        "failed_at": {str(k): curves.failed_pods[k] for k in CHECKPOINTS},
    }


def _points(curve, points) -> dict[str, float]:
    return {str(k): round(curve[k], 4) for k in points if k in curve}


# --- the paper's numbers ------------------------------------------------------------------


def paper_summary() -> dict[tuple[str, str, int], dict[str, float]]:
    """(trace, paper policy label, arrived %) → the reference summary row."""
    rows = {}
    with open(TRACE_DIR / "reference_results" / "summary_by_arrival.csv", newline="") as f:
        for row in csv.DictReader(f):
            trace = row["workload"].removeprefix("openb_pod_list_")
            key = (trace, row["sc_policy"], int(row["arrived_pct"]))
            numbers = {k: v for k, v in row.items() if k.endswith(("median", "mean", "sd"))}
            rows[key] = {k: float(v) for k, v in numbers.items()}
    return rows


def _paper(paper, trace: str, label: str | None, k: int, column: str) -> float | None:
    return paper.get((trace, label, k), {}).get(column) if label else None


def paper_label(name: str) -> str | None:
    return SIM_POLICIES[name].paper if name != OURS else SIM_POLICIES["fgd-paper"].paper


# --- rendering ----------------------------------------------------------------------------


def _values(store, trace: str, name: str, field: str, k: int) -> list[float]:
    runs = store.get(trace, {}).get(name, {})
    return [r[field][str(k)] for r in runs.values() if str(k) in r[field]]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _mean_sd(values: list[float]) -> tuple[float, float] | None:
    if not values:
        return None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _f(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def render(store: dict[str, Any], seeds: tuple[int, ...]) -> str:
    paper = paper_summary()
    lines = [
        "# Packing on the openb trace: `infergrid simulate` beside the FGD paper",
        "",
        "Generated by `bench/packing.py` (do not edit by hand). Protocol as the paper's: "
        "the 1213 GPU nodes, pods shuffled per seed, inflated to 130% of the 6212 GPUs by "
        "sampling with replacement, one attempt per pod, no departures; seeds "
        f"{seeds[0]}–{seeds[-1]} ({len(seeds)}). The paper's numbers are its authors' runs "
        "(`shared/traces/openb/reference_results`). Our runs use our own shuffles, so seeds "
        "do not pair up with theirs: compare medians and means.",
        "",
        "Policies: **fgd-plus** is ours. fgd-paper, best-fit, dot-product, gpu-packing, "
        "gpu-clustering and random-fit are our replicas of the paper's FGD and baselines, "
        "run through the placement core's tables. fgd, binpack and spread are the extender's.",
        "",
    ]
    lines += _default_table(store, paper)
    lines += _reproduction_table(store, paper)
    lines += _frag_table(store, paper)
    lines += _variant_table(store, paper)
    lines += _reduction_table(store)
    lines += _timing_table(store)
    return "\n".join(lines) + "\n"


def _default_table(store, paper) -> list[str]:
    head = ["policy", *(f"{k}% ours (paper)" for k in CHECKPOINTS)]
    rows = []
    for name in policies_for("default"):
        label = paper_label(name) if name != OURS else None
        cells = [f"**{name}**" if name == OURS else name]
        for k in CHECKPOINTS:
            ours = _median(_values(store, "default", name, "unalloc", k))
            theirs = _paper(paper, "default", label, k, "unalloc_gpu_pct_median")
            cells.append(_f(ours) + (f" ({_f(theirs)})" if theirs is not None else ""))
        rows.append(cells)
    return [
        "## Default trace: unallocated GPU % by arrived workload (median over seeds)",
        "",
        *_table(head, rows),
        "",
        "fgd-plus has no paper counterpart: compare it with fgd-paper's row, or with the "
        "paper's FGD (4.77% at 100%).",
        "",
    ]


def _reproduction_table(store, paper) -> list[str]:
    rows = []
    for name in PAPER_POLICIES:
        ours = _median(_values(store, "default", name, "unalloc", 100))
        theirs = paper.get(("default", paper_label(name), 100), {}).get("unalloc_gpu_pct_median")
        if ours is None or theirs is None:
            continue
        gap = ours - theirs
        verdict = "yes" if abs(gap) <= 1.0 else "**no**"
        must = " (required)" if name in MUST_MATCH else ""
        rows.append([name + must, _f(ours), _f(theirs), f"{gap:+.2f}", verdict])
    return [
        "## Reproduction: default trace, 100% arrived, median unallocated GPU %",
        "",
        *_table(["policy", "ours", "paper", "ours − paper (pp)", "within 1 pp"], rows),
        "",
    ]


def _frag_table(store, paper) -> list[str]:
    head = ["policy", *(f"{k}% ours (paper)" for k in FRAG_POINTS)]
    rows = []
    for name in (OURS, *PAPER_POLICIES):
        label = paper_label(name) if name != OURS else None
        cells = [name]
        for k in FRAG_POINTS:
            ours = _median(_values(store, "default", name, "frag", k))
            theirs = _paper(paper, "default", label, k, "frag_ratio_pct_median")
            cells.append(_f(ours, 1) + (f" ({_f(theirs, 1)})" if theirs is not None else ""))
        rows.append(cells)
    return [
        "## Default trace: fragmentation rate % (median over seeds)",
        "",
        *_table(head, rows),
        "",
    ]


def _variant_table(store, paper) -> list[str]:
    names = (OURS, *PAPER_POLICIES)
    head = ["trace", *names, "fgd-plus ≤ FGD"]
    rows = []
    for trace in TRACES:
        if trace not in store:
            continue
        cells = [trace]
        ok = []
        for name in names:
            ours = _mean_sd(_values(store, trace, name, "unalloc", 100))
            label = paper_label(name)
            ref = paper.get((trace, label, 100))
            theirs = f" ({ref['unalloc_gpu_pct_mean']:.2f})" if ref and name != OURS else ""
            cell = "–" if ours is None else f"{ours[0]:.2f}±{ours[1]:.2f}{theirs}"
            cells.append(f"**{cell}**" if name == OURS else cell)
        plus = _mean_sd(_values(store, trace, OURS, "unalloc", 100))
        replica = _mean_sd(_values(store, trace, "fgd-paper", "unalloc", 100))
        ref = paper.get((trace, "06-FGD", 100))
        if plus and ref:
            ok.append(plus[0] <= ref["unalloc_gpu_pct_mean"])
        if plus and replica:
            ok.append(plus[0] <= replica[0])
        cells.append("yes" if ok and all(ok) else "**no**" if ok else "–")
        rows.append(cells)
    return [
        "## Every trace: unallocated GPU % at 100% arrived, mean ± sd over seeds (paper's mean)",
        "",
        *_table(head, rows),
        "",
        "The last column: fgd-plus's mean is at most both the paper's FGD mean and our "
        "fgd-paper replica's.",
        "",
    ]


def _reduction_table(store) -> list[str]:
    plus = _median(_values(store, "default", OURS, "unalloc", 100))
    if plus is None:
        return []
    rows = []
    for name in PAPER_POLICIES:
        base = _median(_values(store, "default", name, "unalloc", 100))
        if base is None or base <= 0:
            continue
        rows.append(
            [
                name,
                _f(base),
                f"{100 * (1 - plus / base):.1f}%",
                f"{(base - plus) / 100 * 6212:.0f}",
            ]
        )
    return [
        f"## fgd-plus against each policy, default trace, 100% arrived (fgd-plus: {plus:.2f}%)",
        "",
        *_table(["policy", "its unallocated %", "fgd-plus leaves less by", "GPUs (of 6212)"], rows),
        "",
    ]


def _timing_table(store) -> list[str]:
    rows = []
    for name in policies_for("default"):
        runs = store.get("default", {}).get(name, {})
        if runs:
            seconds = [r["seconds"] for r in runs.values()]
            rows.append([name, f"{statistics.fmean(seconds):.1f}", f"{max(seconds):.1f}"])
    return [
        "## Time per run, default trace (one policy, one seed; 2 runs at once on 2 cores)",
        "",
        *_table(["policy", "mean s", "max s"], rows),
        "",
    ]


def draw(store: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(1, 2, figsize=(12, 5), dpi=120)
    for ax, low in zip(axes, (0, 85), strict=True):
        xs = list(range(low, LAST_BIN + 1))
        ax.plot(xs, [max(0, 100 - x) for x in xs], "k:", linewidth=1, label="ideal")
        for name in policies_for("default"):
            ys = [_median(_values(store, "default", name, "unalloc", k)) for k in xs]
            width = 2.5 if name == OURS else 1.2
            ax.plot(xs, ys, linewidth=width, label=name)
        ax.set_xlabel("arrived workload (% of 6212 GPUs)")
        ax.set_ylabel("unallocated GPUs (%), median of seeds")
        ax.grid(True, linewidth=0.3)
    axes[1].set_ylim(0, 16)
    axes[0].legend(fontsize=8)
    figure.suptitle("openb default trace: unallocated GPU % against arrived workload")
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default="all", help="all, or names like default,cpu250")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--results", type=Path, default=HERE / "packing_results.json")
    parser.add_argument("--out", type=Path, default=HERE / "packing.md")
    parser.add_argument("--png", type=Path, default=HERE / "packing.png")
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args()
    traces = list(TRACES) if args.traces == "all" else args.traces.split(",")
    seeds = parse_seeds(args.seeds)
    store: dict[str, Any] = json.loads(args.results.read_text()) if args.results.exists() else {}
    if not args.render_only:
        sweep(traces, seeds, args.jobs, store, args.results)
    text = render(store, seeds)
    print(text)
    args.out.write_text(text)
    if "default" in store:
        draw(store, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
