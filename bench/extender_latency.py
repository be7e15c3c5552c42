"""Extender latency over real HTTP: this checkout beside an earlier revision, in one run.

Filter and prioritize latency, p50 and p99, at 100, 1,000 and 5,000 nodes of 8
GPUs in a mixed state (about half of the memory assigned to shares and whole
GPUs, some measured use outside assignments), for a stream of pods of typical
shapes, each bound between calls so the state keeps moving. Each extender runs
in a process of its own (``bench/extender_server.py``), as in production, with
tentative reservations where its revision has them (bind then confirms the
hold). ``--baseline REV`` serves the same cache and pods from that revision's
code too, row beside row, and prints each of this checkout's p99s over the
baseline's under the same policy (or, for a policy the baseline lacks, over its
binpack, its default, and its fgd). Then the preempt verb's p50 and p99 at each size (this
checkout only), for pods above every seeded pod's priority but the online ones', over as
many candidate nodes as kube-scheduler sends by default (10% of the nodes, at least 100).
``--warmup N`` sends one pod of each shape and then N pods of the same stream first, placed
but not counted: the first pod of each shape explains and scores every node afresh (once in
an extender's life), and a warmed extender shows what the pods after those pay; the first
pod of each shape is timed apart (``first of a shape``). The client keeps one connection
open, as kube-scheduler's does. Throughput through the real kube-scheduler, with the wait for
binds and with tentative reservations, is ``bench/burst_placement.py``'s.

    .venv/bin/python -m bench.extender_latency --nodes 100,1000,5000 [--pods 200]
        [--policies binpack,fgd,fgd-cluster-aware] [--baseline b67179c] [--no-preempt]
        [--warmup 0] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SERVER = HERE / "extender_server.py"
CURRENT = "this checkout"


class Server:
    """``extender_server.py`` serving ``policy`` from the code under ``tree``."""

    def __init__(self, tree: Path, nodes: int, policy: str, seed: int):
        env = {**os.environ, "PYTHONPATH": str(tree)}
        command = [sys.executable, str(SERVER), "--nodes", str(nodes), "--policy", policy,
                   "--seed", str(seed)]  # fmt: skip
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.stop()
            raise RuntimeError(f"the extender under {tree} did not start (policy {policy})")
        ready = json.loads(line)
        self.port, self.names = ready["port"], ready["names"]
        self.connection: http.client.HTTPConnection | None = None

    def post(self, path: str, body: dict) -> tuple[float, object]:
        """Seconds from sending the request to its last byte received; parsed afterwards.
        One connection is kept open (HTTP/1.1 keep-alive), as kube-scheduler's client does."""
        data = json.dumps(body).encode()
        if self.connection is None:
            self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        started = time.perf_counter()
        self.connection.request("POST", path, data, {"Content-Type": "application/json"})
        resp = self.connection.getresponse()
        raw = resp.read()
        took = time.perf_counter() - started
        if resp.status != 200:
            raise RuntimeError(f"{path} answered {resp.status}: {raw[:200]!r}")
        return took, json.loads(raw)

    def stop(self) -> None:
        if self.connection is not None:
            self.connection.close()
        self.process.kill()
        self.process.wait()


def pct(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {"p50_ms": round(statistics.median(ms), 3),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3)}  # fmt: skip


def latency(
    tree: Path, label: str, nodes: int, pods: int, policy: str, seed: int = 7, warmup: int = 0
) -> dict:
    """One extender, one stream of pods: each filtered, scored, and bound where it scored
    best. With ``warmup``, one pod of each shape (timed apart) and ``warmup`` pods of the
    stream go first, not counted."""
    sys.path.insert(0, str(HERE))
    from extender_server import SHAPES, pod_json  # the pods the server's cache was built from

    server = Server(tree, nodes, policy, seed)
    rnd = random.Random(seed + 1)
    firsts = len(SHAPES) if warmup else 0
    times: dict[str, list[float]] = {"filter": [], "prioritize": [], "first": []}
    passed = []
    try:
        for i in range(firsts + warmup + pods):
            pod = pod_json(10_000_000 + i, rnd, i if i < firsts else None)
            kept = "first" if i < firsts else None if i < firsts + warmup else ""
            took, result = server.post("/filter", {"Pod": pod, "NodeNames": server.names})
            feasible = result["NodeNames"]
            if kept is not None:
                times[kept or "filter"].append(took)
            if kept == "":
                passed.append(len(feasible))
            if not feasible:
                continue
            took, scores = server.post("/prioritize", {"Pod": pod, "NodeNames": feasible})
            if kept is not None:
                times[kept or "prioritize"].append(took)
            best = max(scores, key=lambda s: (s["Score"], s["Host"]))["Host"]
            server.post("/bench/reserve", {"Pod": pod, "Node": best})
    finally:
        server.stop()
    return {"code": label, "policy": policy, "nodes": nodes, "gpus": nodes * 8, "pods": pods,
            "warmup": warmup, "mean_feasible_nodes": round(statistics.mean(passed)),
            "filter": pct(times["filter"]), "prioritize": pct(times["prioritize"]),
            "first_of_a_shape_max_ms": round(max(times["first"], default=0) * 1000, 3)}  # fmt: skip


def preempt_latency(tree: Path, label: str, nodes: int, pods: int, seed: int = 7) -> dict:
    """The preempt verb: for each pod (above the seeded online work's priority), kube-scheduler's
    candidate nodes, as many as its defaults send (10% of the nodes, at least 100), each with
    no victims of its own, so that the extender chooses them all."""
    sys.path.insert(0, str(HERE))
    from extender_server import ONLINE_PRIORITY, pod_json

    server = Server(tree, nodes, "binpack", seed)
    rnd = random.Random(seed + 2)
    candidates = max(100, nodes // 10)
    took_all, kept = [], []
    try:
        for i in range(pods):
            pod = pod_json(20_000_000 + i, rnd)
            pod["spec"]["priority"] = ONLINE_PRIORITY + 1
            names = rnd.sample(server.names, min(candidates, len(server.names)))
            victims = {n: {"Pods": [], "NumPDBViolations": 0} for n in names}
            took, result = server.post("/preempt", {"Pod": pod, "NodeNameToMetaVictims": victims})
            took_all.append(took)
            kept.append(len(result["NodeNameToMetaVictims"]))
    finally:
        server.stop()
    return {"code": label, "verb": "preempt", "nodes": nodes, "candidates": candidates,
            "pods": pods, "mean_kept_nodes": round(statistics.mean(kept)),
            "preempt": pct(took_all)}  # fmt: skip


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """The revision's files in a temporary directory (``git archive``), for its code."""
    with tempfile.TemporaryDirectory(prefix="infergrid-baseline-") as where:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev],
                                 check=True, capture_output=True).stdout  # fmt: skip
        with tempfile.TemporaryFile() as tar:
            tar.write(archive)
            tar.seek(0)
            with tarfile.open(fileobj=tar) as files:
                files.extractall(where, filter="data")
        yield Path(where)


def policies_of(tree: Path) -> set[str]:
    """The placement policies the code under ``tree`` knows."""
    code = "from infergrid.constants import PLACEMENT_POLICIES as P; print(','.join(P))"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    found = subprocess.run([sys.executable, "-c", code], env=env, cwd=tree, check=True,
                           capture_output=True, text=True).stdout  # fmt: skip
    return set(found.strip().split(","))


def ratios(rows: list[dict]) -> list[dict]:
    """Each of this checkout's p99s over the baseline's at the same size: same policy, or,
    for a policy the baseline lacks, over its binpack (its default) and its fgd."""
    base = {(r["nodes"], r["policy"]): r for r in rows if r["code"] != CURRENT}
    out = []
    for r in rows:
        if r["code"] != CURRENT:
            continue
        same = (r["nodes"], r["policy"])
        keys = [same] if same in base else [(r["nodes"], p) for p in ("binpack", "fgd")]
        for key in keys:
            b = base.get(key)
            if b is None:
                continue
            out.append({"nodes": r["nodes"], "policy": r["policy"], "against": b["policy"],
                        "filter_p99": round(r["filter"]["p99_ms"] / b["filter"]["p99_ms"], 3),
                        "prioritize_p99": round(
                            r["prioritize"]["p99_ms"] / b["prioritize"]["p99_ms"], 3)})  # fmt: skip
    return out


def print_row(r: dict) -> None:
    print(f"{r['code']:>16} {r['policy']:>18} {r['nodes']:>6} {r['mean_feasible_nodes']:>9}"
          f" {r['filter']['p50_ms']:>11.2f} {r['filter']['p99_ms']:>11.2f}"
          f" {r['prioritize']['p50_ms']:>9.2f} {r['prioritize']['p99_ms']:>9.2f}"
          f" {r['first_of_a_shape_max_ms'] or '':>9}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,1000,5000")
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--policies", default="binpack,fgd,fgd-cluster-aware")
    parser.add_argument("--baseline", help="a git revision whose code to measure beside")
    parser.add_argument("--no-preempt", action="store_true", help="skip the preempt verb's rows")
    parser.add_argument("--warmup", type=int, default=0, help="pods placed first, not counted")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    policies = args.policies.split(",")
    sizes = [int(x) for x in args.nodes.split(",")]
    if not args.json:
        print(f"{'code':>16} {'policy':>18} {'nodes':>6} {'feasible':>9} {'filter p50':>11}"
              f" {'filter p99':>11} {'prio p50':>9} {'prio p99':>9} {'1st/shape':>9}"
              "   (ms; 1st/shape: a shape's first pod's slowest verb)")  # fmt: skip
    rows: list[dict] = []
    with contextlib.ExitStack() as stack:
        trees = [(CURRENT, ROOT)]
        if args.baseline:
            trees.insert(0, (args.baseline, stack.enter_context(checkout(args.baseline))))
        known = {label: policies_of(tree) for label, tree in trees}
        for n in sizes:
            for policy in policies:
                for label, tree in trees:
                    if policy not in known[label]:
                        continue
                    rows.append(latency(tree, label, n, args.pods, policy, warmup=args.warmup))
                    if not args.json:
                        print_row(rows[-1])
    preempts = [preempt_latency(ROOT, CURRENT, n, args.pods) for n in sizes if not args.no_preempt]
    compared = ratios(rows) if args.baseline else []
    if args.json:
        print(json.dumps({"latency": rows, "preempt": preempts, "p99_over_baseline": compared},
                         indent=2))  # fmt: skip
        return
    for r in preempts:
        print(f"{r['code']:>16} {'preempt verb':>18} {r['nodes']:>6} {r['candidates']:>9}"
              f" {r['preempt']['p50_ms']:>11.2f} {r['preempt']['p99_ms']:>11.2f}"
              f"   (candidates; p50/p99 ms; {r['mean_kept_nodes']} kept on average)")  # fmt: skip
    for c in compared:
        print(
            f"{c['nodes']:>6} nodes, {c['policy']} over {args.baseline}'s {c['against']}:"
            f" filter p99 x{c['filter_p99']}, prioritize p99 x{c['prioritize_p99']}"
        )


if __name__ == "__main__":
    main()
