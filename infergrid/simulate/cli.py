"""``infergrid simulate``: replay a trace under several policies and seeds, and report.

    infergrid simulate --nodes N.csv --pods P.csv --policies fgd,best-fit --seeds 42-51 --json

Runs (one policy on one seed) are independent; ``--jobs`` runs that many at
once in worker processes. Progress goes to stderr, the report to stdout.
The production policies learn their workload from the pods as the extender
does; ``--workload trace`` feeds them the trace's typical pods instead.
"""

import argparse
import multiprocessing
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from infergrid.errors import ContractError
from infergrid.simulate.arrivals import DEFAULT_INFLATION
from infergrid.simulate.metrics import DEFAULT_CHECKPOINTS, LAST_BIN
from infergrid.simulate.policies import SIM_POLICIES, SimPolicy, parse_policies
from infergrid.simulate.replay import RunResult, Scenario, replay
from infergrid.simulate.report import PolicyResult, TraceInfo, dumps, table, to_json, write_png
from infergrid.simulate.trace import MILLI_GPU, TraceNode, TracePod, load_nodes, load_pods

DEFAULT_SEEDS: Final = "42-51"
WORKLOADS: Final = ("learned", "trace")
MAX_JOBS: Final = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommand's flags, on the parser ``infergrid`` gives it."""
    parser.add_argument("--nodes", required=True, help="node-list CSV (sn,cpu_milli,...)")
    parser.add_argument("--pods", required=True, help="pod-list CSV (name,cpu_milli,...)")
    parser.add_argument(
        "--policies",
        default="all",
        help=f"comma-separated, or all (default): {', '.join(SIM_POLICIES)}",
    )
    parser.add_argument(
        "--seeds", default=DEFAULT_SEEDS, help="e.g. 42-51 or 42,45 (default: the paper's 42-51)"
    )
    parser.add_argument(
        "--inflation",
        type=float,
        default=DEFAULT_INFLATION,
        help="arrivals stop at this multiple of the cluster's GPUs (default 1.3)",
    )
    parser.add_argument(
        "--at",
        default=",".join(str(k) for k in DEFAULT_CHECKPOINTS),
        help="arrived %% checkpoints to report (default 90,95,100,110,130)",
    )
    parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        default=WORKLOADS[0],
        help="what binpack, spread, fgd and fgd-cluster-aware score against: learned from "
        "the pods as the extender does (default), or the trace's typical pods",
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument("--json", action="store_true", help="print the JSON report")
    parser.add_argument("--png", help="also draw unallocated %% against arrived %% here")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> str:
    """Run the simulation the flags describe and return the report text."""
    policies = parse_policies(args.policies)
    seeds = parse_seeds(args.seeds)
    checkpoints = parse_checkpoints(args.at)
    if not 1 <= args.jobs <= MAX_JOBS:
        raise ContractError("jobs", f"must be from 1 to {MAX_JOBS}, got {args.jobs}")
    if not args.inflation > 0:
        raise ContractError("inflation", f"must be above 0, got {args.inflation}")
    nodes, pods = load_nodes(args.nodes), load_pods(args.pods)
    if not any(n.gpus for n in nodes):
        raise ContractError(args.nodes, "no node has a GPU")
    learned = args.workload == WORKLOADS[0]
    results = simulate(nodes, pods, policies, seeds, args.inflation, args.jobs, args.quiet, learned)
    info = _trace_info(args.nodes, args.pods, nodes, pods)
    if args.png:
        title = f"{Path(args.pods).stem}: {len(seeds)} seed(s)"
        write_png(args.png, results, title)
    if args.json:
        return dumps(to_json(info, seeds, args.inflation, checkpoints, results))
    return table(results, checkpoints)


def simulate(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    policies: Sequence[SimPolicy],
    seeds: Sequence[int],
    inflation: float = DEFAULT_INFLATION,
    jobs: int = 1,
    quiet: bool = True,
    learned: bool = True,
) -> tuple[PolicyResult, ...]:
    """Every policy on every seed; ``jobs`` > 1 runs them in that many worker processes.
    ``learned``: the production policies learn their workload (see ``Scenario``)."""
    work = [(p, s) for p in policies for s in seeds]
    done: dict[tuple[str, int], RunResult] = {}
    if jobs == 1 or len(work) == 1:
        _start_worker(nodes, pods, inflation, learned)
        for item in work:
            done[(item[0].name, item[1])] = _report(_run_one(item), quiet)
    else:
        context = multiprocessing.get_context("spawn")
        with context.Pool(
            min(jobs, len(work)),
            initializer=_start_worker,
            initargs=(nodes, pods, inflation, learned),
        ) as pool:
            for result in pool.imap_unordered(_run_one, work):
                done[(result.policy, result.seed)] = _report(result, quiet)
    return tuple(
        PolicyResult(policy, tuple(done[(policy.name, s)] for s in seeds)) for policy in policies
    )


_WORKER: dict[str, object] = {}
"""The scenario of this process, built once by ``_start_worker``."""


def _start_worker(
    nodes: Sequence[TraceNode], pods: Sequence[TracePod], inflation: float, learned: bool
) -> None:
    _WORKER["scenario"] = Scenario.of(nodes, pods, learned)
    _WORKER["inflation"] = inflation


def _run_one(item: tuple[SimPolicy, int]) -> RunResult:
    policy, seed = item
    scenario = _WORKER["scenario"]
    inflation = _WORKER["inflation"]
    assert isinstance(scenario, Scenario) and isinstance(inflation, float)
    return replay(scenario, policy, seed, inflation)


def _report(result: RunResult, quiet: bool) -> RunResult:
    if not quiet:
        print(
            f"{result.policy} seed {result.seed}: {result.pods} pods, "
            f"{result.failed_pods} failed, {result.seconds:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    return result


def parse_seeds(text: str) -> tuple[int, ...]:
    """Seeds as ``42-51``, ``42,45`` or a mix of both; each once, in the order given."""
    seeds: dict[int, None] = {}
    for part in (p.strip() for p in text.split(",")):
        low, dash, high = part.partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise ContractError("seeds", f"{part!r} is not a seed or a range like 42-51") from None
        if last < first:
            raise ContractError("seeds", f"{part!r}: the range runs backwards")
        seeds.update(dict.fromkeys(range(first, last + 1)))
    return tuple(seeds)


def parse_checkpoints(text: str) -> tuple[int, ...]:
    """Arrived % checkpoints, each a whole number from 0 to 130."""
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        try:
            value = int(part)
        except ValueError:
            raise ContractError("at", f"{part!r} is not a whole percent") from None
        if not 0 <= value <= LAST_BIN:
            raise ContractError("at", f"{value} is not from 0 to {LAST_BIN}")
        if value not in out:
            out.append(value)
    return tuple(out)


def _trace_info(
    nodes_path: str, pods_path: str, nodes: Sequence[TraceNode], pods: Sequence[TracePod]
) -> TraceInfo:
    gpus = sum(n.gpus for n in nodes)
    request = sum(p.gpu_request_milli for p in pods)
    return TraceInfo(
        nodes=nodes_path,
        pods=pods_path,
        node_count=len(nodes),
        gpus=gpus,
        pod_count=len(pods),
        gpu_request_pct=100.0 * request / (gpus * MILLI_GPU),
    )
