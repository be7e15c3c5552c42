"""Packing quality on the FGD paper's openb trace: our simulator's numbers beside the paper's.

Replays the traces of the paper's figures (default and 16 variants) under every
policy of ``infergrid simulate``: our fgd-cluster-aware, the extender's fgd, binpack and
spread, and our replicas of the paper's six (fgd-paper, best-fit, dot-product,
gpu-packing, gpu-clustering, random-fit), on seeds 42-51, one run at a time,
through the same ``simulate()`` as the CLI. Then it writes docs/benchmarks/packing.md (the
acceptance checks of issue 5, the reproduction check, timing, notes, and a table
per trace with the paper's numbers beside ours) and draws docs/benchmarks/packing.png
(default trace, median curves).

Every run is saved to --results as it ends, so an interrupted sweep resumes;
--render-only redraws from that file without replaying; --time times one policy
on one seed of the default trace through the CLI and saves that too.

    nice -n 10 .venv/bin/python bench/packing.py [--traces all|default,cpu250]
        [--policies all|fgd-cluster-aware,best-fit] [--seeds 42-51] [--render-only] [--time]
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

from infergrid.placement import LEARNING
from infergrid.simulate.cli import parse_seeds, simulate
from infergrid.simulate.metrics import LAST_BIN
from infergrid.simulate.policies import SIM_POLICIES, sim_policy
from infergrid.simulate.trace import load_nodes, load_pods

HERE = Path(__file__).resolve().parent
TRACE_DIR = HERE.parents[1] / "shared" / "traces" / "openb"
# The report is a page of the docs site (mkdocs.yml), its plot beside it.
REPORT_DIR = HERE.parent / "docs" / "benchmarks"
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
OURS = "fgd-cluster-aware"
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


ALL_POLICIES = (OURS, *PAPER_POLICIES, *EXTENDER_POLICIES)
PRODUCTION = LEARNING
"""The extender's policies that read a workload: they learn it from the pods, as it does
(binpack and spread read none, so one run serves both ways)."""
TRACE_FED = " (trace workload)"
"""Suffix of a production policy's results fed the trace's typical pods (``--workload trace``)
instead of learning: the difference is what learning costs."""
SHOWN = (*ALL_POLICIES, *(p + TRACE_FED for p in PRODUCTION))


def result_key(name: str, learned: bool) -> str:
    """Where a run's results are kept: production policies fed the trace apart."""
    return name if learned or name not in PRODUCTION else name + TRACE_FED


def policies_for(trace: str) -> tuple[str, ...]:
    """Every policy runs on every trace (``--policies`` picks a subset)."""
    return ALL_POLICIES


# --- running ------------------------------------------------------------------------------


def sweep(
    traces: list[str],
    names: tuple[str, ...] | None,
    seeds: tuple[int, ...],
    store: dict[str, Any],
    path: Path,
    learned: bool = True,
) -> None:
    """Replay each missing (trace, policy, seed) one at a time, saving after every run;
    ``learned`` False feeds the production policies the trace's workload."""
    nodes = load_nodes(TRACE_DIR / NODES)
    for trace in traces:
        todo = [
            (name, seed)
            for name in policies_for(trace)
            if names is None or name in names
            for seed in seeds
            if str(seed) not in store.get(trace, {}).get(result_key(name, learned), {})
        ]
        if not todo:
            continue
        pods = load_pods(TRACE_DIR / f"openb_pod_list_{trace}.csv")
        for name, seed in todo:
            (result,) = simulate(
                nodes, pods, [sim_policy(name)], [seed], quiet=True, learned=learned
            )
            (run,) = result.runs
            record = _run_record(run, full=trace == "default")
            if name in PRODUCTION:
                record["workload"] = "learned" if learned else "trace"
            key = result_key(name, learned)
            store.setdefault(trace, {}).setdefault(key, {})[str(seed)] = record
            _save(store, path)
            print(
                f"{trace:12s} {name:15s} seed {seed}: {run.seconds:5.1f} s, "
                f"{record['unalloc'].get('100', float('nan')):.2f}% unallocated at 100%",
                file=sys.stderr,
                flush=True,
            )


def _save(store: dict[str, Any], path: Path) -> None:
    """Write the results atomically, so an interrupted sweep leaves the last good file."""
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(store))
    partial.replace(path)


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
    """The paper's label to set beside a policy: fgd-cluster-aware stands beside the paper's FGD."""
    name = name.removesuffix(TRACE_FED)
    return SIM_POLICIES[name].paper if name != OURS else SIM_POLICIES["fgd-paper"].paper


# --- rendering ----------------------------------------------------------------------------


class View:
    """The saved runs of the chosen seeds, and the paper's summary beside them."""

    def __init__(self, store: dict[str, Any], seeds: tuple[int, ...]) -> None:
        self.store = store
        self.seeds = tuple(str(s) for s in seeds)
        self.paper = paper_summary()

    def values(self, trace: str, name: str, field: str, k: int) -> list[float]:
        runs = self.store.get(trace, {}).get(name, {})
        return [
            runs[s][field][str(k)] for s in self.seeds if s in runs and str(k) in runs[s][field]
        ]

    def median(self, trace: str, name: str, field: str = "unalloc", k: int = 100) -> float | None:
        return _median(self.values(trace, name, field, k))

    def theirs(self, trace: str, name: str, k: int = 100, column: str = "unalloc_gpu_pct_median"):
        label = paper_label(name)
        return self.paper.get((trace, label, k), {}).get(column) if label else None

    def names(self, trace: str) -> list[str]:
        return [n for n in SHOWN if self.store.get(trace, {}).get(n)]

    def traces(self) -> list[str]:
        return [t for t in TRACES if t in self.store]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _mean_sd(values: list[float]) -> tuple[float, float] | None:
    if not values:
        return None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _f(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _pair(ours: float | None, theirs: float | None, digits: int = 2) -> str:
    return _f(ours, digits) + (f" ({_f(theirs, digits)})" if theirs is not None else "")


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def render(store: dict[str, Any], seeds: tuple[int, ...]) -> str:
    view = View(store, seeds)
    lines = [
        "# Packing on the openb trace: `infergrid simulate` beside the FGD paper",
        "",
        "Generated by `bench/packing.py` from the saved runs (do not edit by hand; the "
        "prose lives in that script). Protocol as the paper's: the 1213 GPU nodes, pods "
        "shuffled per seed, inflated to 130% of the 6212 GPUs by sampling with replacement, "
        f"one attempt per pod, no departures; seeds {seeds[0]}–{seeds[-1]} ({len(seeds)}). "
        "The paper's numbers are its authors' runs (`shared/traces/openb/reference_results`, "
        "`summary_by_arrival.csv`). Our runs use our own shuffles, so seeds do not pair up "
        "with theirs: compare medians and means, never single seeds.",
        "",
        "Policies: **fgd-cluster-aware** is ours (`infergrid/placement/fgd_cluster_aware.py`). "
        "fgd-paper, "
        "best-fit, dot-product, gpu-packing, gpu-clustering and random-fit are our replicas "
        "of the paper's FGD and baselines (`infergrid/placement/baselines.py`), run through "
        "the placement core's tables. fgd-cluster-aware, fgd, binpack and spread are the "
        "extender's own. Every placement goes through the extender's entry point, the core's "
        "`NodeSet` (`infergrid/placement/node_set.py`); the simulator only orders arrivals and "
        "picks the best-scored node (`infergrid/simulate/`). fgd and fgd-cluster-aware learn "
        "their workload from the pods as they arrive, as the extender does; rows marked "
        f"'{TRACE_FED.strip()}' were fed the trace's typical pods instead "
        "(`--workload trace`): the difference is what learning costs.",
        "",
        "![default trace: unallocated GPU % against arrived workload, median of "
        f"{len(seeds)} seeds](packing.png)",
        "",
    ]
    lines += REPRODUCE
    lines += _acceptance(view)
    lines += _reproduction_table(view)
    lines += _timing(view)
    lines += NOTES
    lines += _frag_table(view)
    lines += _reduction_table(view)
    lines += _summary_table(view)
    for trace in view.traces():
        lines += _trace_table(view, trace)
    return "\n".join(lines) + "\n"


REPRODUCE = [
    "## Reproduce",
    "",
    "From the repository root, with the virtualenv (`make install`; the PNG needs the "
    "`simulate` extra, matplotlib) and the trace in `../shared/traces/openb/`:",
    "",
    "```sh",
    "# the whole sweep: 10 policies x 17 traces x seeds 42-51 = 1,700 runs of 5-35 s each,",
    "# one at a time (hours on 2 cores); every run is saved to bench/packing_results.json",
    "# as it ends, so a rerun resumes where it stopped",
    "nice -n 10 .venv/bin/python bench/packing.py",
    "# a part of it, e.g. the acceptance runs first",
    "nice -n 10 .venv/bin/python bench/packing.py --traces default "
    "--policies fgd-cluster-aware,fgd-paper,best-fit,dot-product,random-fit",
    "# fgd and fgd-cluster-aware fed the trace's workload instead of learning it",
    "nice -n 10 .venv/bin/python bench/packing.py --workload trace "
    "--policies fgd-cluster-aware,fgd",
    "# time one policy on one seed of the default trace through the CLI (saved with the runs)",
    "nice -n 10 .venv/bin/python bench/packing.py --time",
    "# this file and packing.png again from the saved runs, without replaying",
    ".venv/bin/python bench/packing.py --render-only",
    "# the same replays through the CLI: a table, --json (schema in "
    "infergrid/simulate/report.py), --png",
    "T=../shared/traces/openb",
    ".venv/bin/infergrid simulate --nodes $T/openb_node_list_gpu_node.csv \\",
    "    --pods $T/openb_pod_list_default.csv --policies fgd-cluster-aware,fgd-paper,best-fit \\",
    "    --seeds 42-51 --json",
    "```",
    "",
    "`bench/packing.py` calls the same `simulate()` as `infergrid simulate`, one policy "
    "and one seed at a time; a run's numbers do not depend on what else runs.",
    "",
]


def _acceptance(view: View) -> list[str]:
    rows = []
    for trace in view.traces():
        plus = view.values(trace, OURS, "unalloc", 100)
        if not plus:
            continue
        plus_median, (plus_mean, _) = _median(plus), _mean_sd(plus)
        fgd_median = view.theirs(trace, "fgd-paper")
        fgd_mean = view.theirs(trace, "fgd-paper", column="unalloc_gpu_pct_mean")
        replica = view.median(trace, "fgd-paper")
        checks = [plus_median <= fgd_median, plus_mean <= fgd_mean] if fgd_median else []
        if replica is not None:
            checks.append(plus_median <= replica)
        best = min(
            (n for n in (OURS, *EXTENDER_POLICIES) if view.values(trace, n, "unalloc", 100)),
            key=lambda n: view.median(trace, n) or 0.0,
        )
        best_median = view.median(trace, best)
        best_ok = fgd_median is not None and best_median is not None
        rows.append(
            [
                trace,
                _f(plus_median),
                _f(fgd_median),
                _f(None if fgd_median is None else fgd_median - plus_median),
                _f(plus_mean),
                _f(fgd_mean),
                _f(replica),
                _verdict(checks),
                f"{best} {_f(best_median)}",
                _verdict([best_median <= fgd_median] if best_ok else []),
            ]
        )
    return [
        "## Acceptance: our policies against FGD, 100% arrived, unallocated GPU %",
        "",
        *_table(
            [
                "trace",
                "fgd-cluster-aware median",
                "paper FGD median",
                "margin (pp)",
                "fgd-cluster-aware mean",
                "paper FGD mean",
                "our fgd-paper median",
                "fgd-cluster-aware ≤ FGD",
                "our best (median)",
                "best ≤ paper FGD",
            ],
            rows,
        ),
        "",
        "Margin: the paper's FGD median minus fgd-cluster-aware's. "
        "fgd-cluster-aware ≤ FGD holds when "
        "fgd-cluster-aware's median and mean are both at most the paper's FGD's, and its median at "
        "most our fgd-paper replica's on the same shuffles. Our best is the lowest median "
        "among fgd-cluster-aware and the extender's fgd, binpack and spread, of those that ran on "
        "the trace (see the seeds column of each trace's table).",
        "",
    ]


def _verdict(checks: list[bool]) -> str:
    return "yes" if checks and all(checks) else "**no**" if checks else "–"


def _reproduction_table(view: View) -> list[str]:
    rows = []
    for name in PAPER_POLICIES:
        ours, theirs = view.median("default", name), view.theirs("default", name)
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


def _timing(view: View) -> list[str]:
    timing = view.store.get(TIMING_KEY)
    lines = ["## Time", ""]
    if timing:
        lines += [
            f"One policy ({timing['policy']}) on one seed ({timing['seed']}) of the default "
            f"trace, through the CLI, loading the trace included: **{timing['seconds']:.1f} s** "
            f"wall ({timing['pods']} pods, {timing['replay_seconds']:.1f} s of it the replay), "
            f"measured {timing['when']} on this project's 2-core machine (load average "
            f"{timing['load']:.1f} before the run). Replays vary by up to a third from run to "
            "run here. The bound is 30 s.",
            "",
            f"    {timing['command']}",
            "",
        ]
    rows = []
    for name in ALL_POLICIES:
        seconds = [r["seconds"] for r in view.store.get("default", {}).get(name, {}).values()]
        if seconds:
            rows.append([name, f"{statistics.fmean(seconds):.1f}", f"{max(seconds):.1f}"])
    lines += [
        "Replay time per run on the default trace as the sweep recorded it (trace loading "
        "excluded; the machine was shared, and some runs ran two at a time, so these "
        "vary by up to 2×):",
        "",
        *_table(["policy", "mean s", "max s"], rows),
        "",
    ]
    return lines


def _frag_table(view: View) -> list[str]:
    points = (*FRAG_POINTS, 100)
    head = ["policy", *(f"{k}% ours (paper)" for k in points)]
    rows = []
    for name in view.names("default"):
        cells = [name]
        for k in points:
            ours = view.median("default", name, "frag", k)
            cells.append(_pair(ours, view.theirs("default", name, k, "frag_ratio_pct_median"), 1))
        rows.append(cells)
    return [
        "## Default trace: fragmentation rate % by arrived workload (median over seeds)",
        "",
        *_table(head, rows),
        "",
    ]


def _reduction_table(view: View) -> list[str]:
    plus = view.median("default", OURS)
    if plus is None:
        return []
    rows = []
    for name in view.names("default"):
        base = view.median("default", name)
        if name == OURS or base is None or base <= 0:
            continue
        reduction = f"{100 * (1 - plus / base):.1f}%"
        rows.append([name, _f(base), reduction, f"{(base - plus) / 100 * 6212:.0f}"])
    return [
        "## fgd-cluster-aware against each policy, default trace, 100% arrived "
        f"(fgd-cluster-aware: {plus:.2f}%)",
        "",
        *_table(
            ["policy", "its unallocated %", "fgd-cluster-aware leaves less by", "GPUs (of 6212)"],
            rows,
        ),
        "",
        "For scale: the paper's FGD leaves 49.5% less than its DotProd (290 GPUs) and 33% "
        "less than its BestFit (144 GPUs).",
        "",
    ]


def _summary_table(view: View) -> list[str]:
    names = [n for n in ALL_POLICIES if any(view.store.get(t, {}).get(n) for t in TRACES)]
    rows = []
    for trace in view.traces():
        cells = [trace]
        for name in names:
            ours = _mean_sd(view.values(trace, name, "unalloc", 100))
            mean = view.theirs(trace, name, column="unalloc_gpu_pct_mean")
            cell = "–" if ours is None else f"{ours[0]:.2f}±{ours[1]:.2f}"
            if ours is not None and mean is not None:
                cell += f" ({mean:.2f})"
            cells.append(f"**{cell}**" if name == OURS else cell)
        rows.append(cells)
    return [
        "## Every trace at 100% arrived: mean ± sd over seeds (the paper's mean)",
        "",
        "As the paper's Figs. 11–14 report them. Medians, with the other arrived points, "
        "are in the per-trace tables below.",
        "",
        *_table(["trace", *names], rows),
        "",
    ]


def _trace_table(view: View, trace: str) -> list[str]:
    head = [
        "policy",
        *(f"{k}%" for k in CHECKPOINTS),
        "frag rate @100%",
        "failed pods @100% / @130%",
        "seeds",
    ]
    rows = []
    for name in view.names(trace):
        cells = [f"**{name}**" if name == OURS else name]
        for k in CHECKPOINTS:
            cells.append(_pair(view.median(trace, name, "unalloc", k), view.theirs(trace, name, k)))
        frag = view.median(trace, name, "frag", 100)
        cells.append(_pair(frag, view.theirs(trace, name, 100, "frag_ratio_pct_median"), 1))
        failed = [view.median(trace, name, "failed_at", k) for k in (100, 130)]
        cells.append(" / ".join(_f(v, 0) for v in failed))
        cells.append(str(len(view.values(trace, name, "unalloc", 100))))
        rows.append(cells)
    title = "default trace" if trace == "default" else f"variant {trace}"
    return [
        f"## {title}: median unallocated GPU % by arrived workload, ours (paper)",
        "",
        *_table(head, rows),
        "",
    ]


NOTES = [
    "## Where our numbers differ from the paper's, and why",
    "",
    "- **Seeds do not pair up.** The paper's simulator shuffles and resamples with Go's "
    "`math/rand`; ours with Python's `random.Random(seed)`. Seed 42 is a different draw "
    "of the same protocol, so single runs differ by the seed-to-seed spread (the paper's "
    "sd at 100% arrived on the default trace: 0.1–0.3 pp for FGD, best-fit, dot-product "
    "and random-fit, 0.5–0.6 pp for gpu-packing and gpu-clustering; up to 0.8 pp on the "
    "variants). Only medians and means compare.",
    "- **The three required baselines agree within 0.2 pp** on the default trace, and so "
    "does our fgd-paper replica, so no required number needed explaining away. Over all 17 "
    "traces the means of our fgd-paper, best-fit, dot-product and random-fit stay within "
    "0.5 pp of the paper's (largest gaps: dot-product −0.49 and fgd-paper +0.40 on cpu250, "
    "random-fit +0.42 on multigpu40), with no sign that holds across traces (average gap "
    "−0.01 to +0.08 pp).",
    "- **gpu-clustering and gpu-packing pack a little better than the paper's**, the "
    "only gaps that point the same way on most traces. gpu-clustering: 0.30 pp lower on "
    "average over the 17 traces (lower on 15), 0.56 pp at most (multigpu50). The likely "
    "cause (not tested): "
    "the paper's plugin tells five GPU-request classes apart (share, 1-, 2-, 4- and "
    "8-GPU); ours, reading the core's GPU state, tells two (share and whole), so whole-GPU "
    "pods of every size count as one class and fill nodes more first-fit. gpu-packing: "
    "0.13 pp lower on average (lower on 14), 0.52 pp at most (gpushare40); we have not "
    "found a cause, and it is within the paper's own seed spread for that policy. Both "
    "stay within 1 pp everywhere.",
    "- **Failed pods have no paper column**: the authors' `analysis_fail.csv` was too large "
    "for the stored snapshot of their results.",
    "- **cpu250 is where CPU runs short, and fgd-cluster-aware keeps CPU for the CPU-only pods "
    "there.** With a quarter of the pods CPU-only, the typical pods ask for 18.4 cores "
    "per GPU against the cluster's 17.2 (14.4 on default, 16.5 on cpu200), so CPU, not "
    "GPUs, decides how much is placed. Where that holds (`cpu_short`; of the 17 traces, "
    "only cpu250) fgd-cluster-aware keeps beside each free GPU the CPU-only pods' 7.4 cores per "
    "GPU as well as the GPU pods' 11.0, and CPU-only pods that tie go, as binpack's do, "
    "to the node with the fewest free GPUs; elsewhere it is unchanged. Before, keeping "
    "11.0 cores, it left 6.86% on cpu250 (mean 6.82), above the paper's FGD (6.80). On "
    "seed 42 it had sent CPU-heavy GPU pods to the CPU-rich T4 nodes (13 cores per GPU "
    "there, binpack 11) and CPU-only pods to idle G3 and G2 nodes, so by 90% arrived "
    "the T4 nodes' CPU was nearly spent, the late CPU-only pods took the CPU of G2 "
    "nodes' free GPUs, and 8-GPU pods found no node. Now GPU pods go first to nodes "
    "short of CPU, whose GPUs would be stranded anyway, and the T4 nodes keep their CPU "
    "for the CPU-only pods: 5.05, also under the extender's binpack (5.84), which "
    "ignores CPU but fills one node after another and puts CPU-only pods on the "
    "fullest node. Keeping part of the CPU-only pods' CPU on the other traces too (in "
    "proportion to how much of the spare CPU they ask for) took cpu200 from 4.59 to "
    "4.24 but gpuspec33 from 5.11 to 6.75, so fgd-cluster-aware does it only where CPU is short.",
    "- **The extender's fgd is not the paper's FGD**: it compares exact scores, so pods "
    "spread over nodes whose fragmentation differs by noise, and it leaves about 0.9 pp "
    "more unallocated than fgd-paper on the default trace; the paper's integer 0–100 "
    "sigmoid ties such nodes and the tie goes to the first in node order. fgd-cluster-aware keeps "
    "that quantisation on purpose.",
    "- In the per-trace tables, the paper's number beside **fgd-cluster-aware** is the "
    "paper's FGD; "
    "fgd, binpack and spread have no paper counterpart. For the sweep's time budget they "
    "ran on the default trace, binpack also on every cpu* trace, and fgd and spread also "
    "on cpu250. The seeds column of each table says how many seeds a cell has. On cpu250 "
    "the learned fgd-cluster-aware leaves about 6.7%, against 5.05 fed the trace's "
    "workload: the CPU-only "
    "pods never reach the extender (kube-scheduler calls it only for pods asking for its "
    "resources), so the learned workload cannot see that CPU runs short.",
    "",
]
"""Why ours and the paper's differ where they do (checked against the saved runs)."""


def draw(view: View, path: Path) -> None:
    """The default trace's median curves, two panels (all of it, and 85-130%), kept small."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(1, 2, figsize=(10, 4), dpi=80)
    for ax, low in zip(axes, (0, 85), strict=True):
        xs = list(range(low, LAST_BIN + 1))
        ax.plot(xs, [max(0, 100 - x) for x in xs], "k:", linewidth=1, label="ideal")
        for name in view.names("default"):
            ys = [view.median("default", name, "unalloc", k) for k in xs]
            width = 2.5 if name == OURS else 1.2
            ax.plot(xs, ys, linewidth=width, label=name)
        ax.set_xlabel("arrived workload (% of 6212 GPUs)")
        ax.set_ylabel("unallocated GPUs (%), median of seeds")
        ax.grid(True, linewidth=0.3)
    axes[1].set_ylim(0, 16)
    axes[0].legend(fontsize=7)
    figure.suptitle("openb default trace: unallocated GPU % against arrived workload")
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
    _shrink(path)


def _shrink(path: Path) -> None:
    """Re-save the PNG with a small palette: a few tens of kB instead of over 100."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=64)
    small.save(path, optimize=True)


# --- timing -------------------------------------------------------------------------------

TIMING_KEY = "_timing"
"""Where --time saves its measurement in the results file (beside the traces)."""


def time_one(store: dict[str, Any], path: Path, policy: str = OURS, seed: int = 42) -> None:
    """Time ``infergrid simulate`` on one policy and one seed of the default trace."""
    import datetime
    import os
    import subprocess

    command = [
        str(Path(sys.executable).parent / "infergrid"),
        "simulate",
        "--nodes",
        str(TRACE_DIR / NODES),
        "--pods",
        str(TRACE_DIR / "openb_pod_list_default.csv"),
        "--policies",
        policy,
        "--seeds",
        str(seed),
        "--json",
        "--quiet",
    ]
    load = os.getloadavg()[0]
    started = time.perf_counter()
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    seconds = time.perf_counter() - started
    (run,) = json.loads(out)["policies"][0]["runs"]
    shown = " ".join(["infergrid", *(a.replace(str(TRACE_DIR), "$T") for a in command[1:])])
    store[TIMING_KEY] = {
        "policy": policy,
        "seed": seed,
        "seconds": round(seconds, 1),
        "replay_seconds": run["seconds"],
        "pods": run["pods"],
        "load": round(load, 2),
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shown,
    }
    _save(store, path)
    print(f"one policy, one seed: {seconds:.1f} s wall", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default="all", help="all, or names like default,cpu250")
    parser.add_argument(
        "--policies", default="all", help=f"all, or names among {','.join(ALL_POLICIES)}"
    )
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--results", type=Path, default=HERE / "packing_results.json")
    parser.add_argument("--out", type=Path, default=REPORT_DIR / "packing.md")
    parser.add_argument("--png", type=Path, default=REPORT_DIR / "packing.png")
    parser.add_argument("--render-only", action="store_true", help="no replays: redraw only")
    parser.add_argument("--time", action="store_true", help="time one run through the CLI")
    parser.add_argument(
        "--workload",
        choices=("learned", "trace"),
        default="learned",
        help="production policies learn their workload as the extender does (default), or "
        f"are fed the trace's (kept as '<policy>{TRACE_FED}')",
    )
    args = parser.parse_args()
    traces = list(TRACES) if args.traces == "all" else args.traces.split(",")
    names = None if args.policies == "all" else tuple(args.policies.split(","))
    unknown = [t for t in traces if t not in TRACES] + [
        n for n in names or () if n not in ALL_POLICIES
    ]
    if unknown:
        parser.error(f"unknown trace or policy: {', '.join(unknown)}")
    seeds = parse_seeds(args.seeds)
    store: dict[str, Any] = json.loads(args.results.read_text()) if args.results.exists() else {}
    if args.time:
        time_one(store, args.results)
    elif not args.render_only:
        sweep(traces, names, seeds, store, args.results, args.workload == "learned")
    text = render(store, seeds)
    print(text)
    args.out.write_text(text)
    if "default" in store:
        draw(View(store, seeds), args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
