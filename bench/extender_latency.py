"""Extender latency over real HTTP, and kube-scheduler throughput with and without it.

Part 1 (always): filter and prioritize latency, p50 and p99, at 100, 1,000 and
5,000 nodes of 8 GPUs in a mixed state (about half of the memory assigned to
shares and whole GPUs, some measured use outside assignments), for a stream
of pods of typical shapes, each bound between calls so the state keeps moving.
This is the extender's own work: pods are bound through a bench route, so the
service runs without its wait for earlier pods' binds (bindWaitSeconds 0),
which part 2 includes.

Part 2: pods per second through the real kube-scheduler on 1,000 KWOK nodes
of a fresh local cluster: the same gated pods released at once, bound by
infergrid-scheduler with the extender, against the default scheduler without
it, and their ratio; and once more with the extender's bindWaitSeconds 0, to
show what its wait for earlier pods' binds costs. (--cluster-nodes 0 skips it.)

    .venv/bin/python -m bench.extender_latency --nodes 100,1000,5000 [--pods 200] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import random
import statistics
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

from aiohttp import web

from infergrid.assignment_annotation import encode_assignment
from infergrid.constants import (
    ANNOTATION_GPU_ASSIGNMENT,
    ANNOTATION_GPU_INVENTORY,
    ANNOTATION_GPU_USAGE,
    ANNOTATION_TOPOLOGY,
    RESOURCE_GPU,
    RESOURCE_GPU_CORES,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
)
from infergrid.fleet import Fleet, parse_fleet
from infergrid.inventory import encode_inventory
from infergrid.placement import build_node_state, fit, resolve_policy, to_pod_assignment
from infergrid.pod_request import parse_pod_request
from infergrid.usage import GpuUsage, GpuUsageSample, encode_usage
from scheduler_extender.app import ExtenderService
from scheduler_extender.binder import Binder
from scheduler_extender.view import PlacementView
from scheduler_extender.watch_cache import ADDED, ClusterCache

NOW = datetime.now(UTC)
MODELS = [
    ("NVIDIA A100-SXM4-80GB", 81920, 108, "8.0", "all"),
    ("NVIDIA H100 80GB HBM3", 81559, 132, "9.0", "all"),
    ("NVIDIA L4", 23034, 58, "8.9", "none"),
]
SHAPES = [  # (limits, annotations, weight): what inference fleets ask for
    ({RESOURCE_VGPU: "1", RESOURCE_GPU_MEMORY: "4096"}, {}, 30),
    ({RESOURCE_VGPU: "1", RESOURCE_GPU_MEMORY: "8192", RESOURCE_GPU_CORES: "30"}, {}, 25),
    ({RESOURCE_VGPU: "1", RESOURCE_GPU_MEMORY: "16384"}, {}, 15),
    ({RESOURCE_GPU: "1"}, {}, 20),
    ({RESOURCE_GPU: "2"}, {ANNOTATION_TOPOLOGY: "nvlink"}, 7),
    ({RESOURCE_GPU: "4"}, {ANNOTATION_TOPOLOGY: "nvlink"}, 3),
]


def pod_json(i: int, rnd: random.Random) -> dict:
    limits, annotations, _ = rnd.choices(SHAPES, weights=[s[2] for s in SHAPES])[0]
    return {
        "metadata": {"name": f"pod-{i}", "namespace": "bench", "uid": f"uid-{i}",
                     "annotations": dict(annotations)},
        "spec": {"containers": [{"name": "engine", "resources": {"limits": dict(limits)}}]},
    }  # fmt: skip


def fleet(nodes: int, rnd: random.Random):
    groups = []
    for i in range(nodes):
        model, mib, sms, cc, nvlink = MODELS[i % len(MODELS)]
        groups.append({
            "name": f"node-{i:05d}",
            "gpus": {"model": model, "count": 8, "memoryMiB": mib, "smCount": sms,
                     "computeCapability": cc},
            "topology": {"nvlink": nvlink, "numaNodes": 2},
        })  # fmt: skip
    return parse_fleet({"version": "v1", "nodes": groups}, "bench").nodes


def mixed_cache(nodes: int, rnd: random.Random) -> ClusterCache:
    """Nodes half full of the same shapes, placed by the core itself, plus foreign use."""
    cache = ClusterCache()
    binpack = resolve_policy("binpack")
    uid = 0
    for node in fleet(nodes, rnd):
        inv = node.inventory
        used = {g.uuid: rnd.choice([0, 0, 0, 2048]) for g in inv.gpus}
        usage = GpuUsage(inv.node, NOW, tuple(GpuUsageSample(u, m, 0) for u, m in used.items()))
        state = build_node_state(inv, usage, (), NOW, timedelta(days=1))
        target = rnd.uniform(0.3, 0.7) * sum(g.memory_mib for g in inv.gpus)
        held = 0
        while held < target:
            uid += 1
            result = fit(parse_pod_request(pod_json(uid, rnd)), state, binpack)
            if not result.fits:
                break
            assignment = to_pod_assignment(inv.node, result.placements, NOW)
            held += sum(g.memory_mib for c in assignment.containers for g in c.gpus)
            state = result.after
            cache.apply_pod(ADDED, {
                "metadata": {"uid": f"seed-{uid}", "name": f"seed-{uid}", "namespace": "bench",
                             "resourceVersion": "1",
                             "annotations": {
                                 ANNOTATION_GPU_ASSIGNMENT: encode_assignment(assignment)}},
                "spec": {"nodeName": inv.node, "schedulerName": "infergrid-scheduler"},
                "status": {"phase": "Running"},
            })  # fmt: skip
        cache.apply_node(ADDED, {"metadata": {"name": inv.node, "annotations": {
            ANNOTATION_GPU_INVENTORY: encode_inventory(inv),
            ANNOTATION_GPU_USAGE: encode_usage(usage),
        }}})  # fmt: skip
    return cache


class Server:
    """The extender app in a process of its own, as in production: the client's JSON work
    and the server's share no interpreter lock. The process builds the mixed cache, freezes
    it out of garbage collection as the extender does once synced, and serves the real app
    plus one bench-only route that records a placement the way bind would."""

    def __init__(self, nodes: int, seed: int):
        context = multiprocessing.get_context("fork")
        parent, child = context.Pipe()
        self.process = context.Process(target=self._run, args=(nodes, seed, child), daemon=True)
        self.process.start()
        self.port, self.names = parent.recv()

    @staticmethod
    def _run(nodes: int, seed: int, conn) -> None:
        cache = mixed_cache(nodes, random.Random(seed))
        view = PlacementView(cache, timedelta(days=1))
        service = ExtenderService(view, Binder(None, view, "binpack"), "binpack", lambda: True)
        app = service.app()

        async def reserve(request: web.Request) -> web.Response:
            body = await request.json()
            bind_like_the_extender(cache, view, body["Pod"], body["Node"])
            return web.json_response({})

        app.router.add_post("/bench/reserve", reserve)
        gc.collect()
        gc.freeze()

        async def serve() -> None:
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            conn.send((site._server.sockets[0].getsockname()[1], sorted(cache.nodes())))
            await asyncio.Event().wait()

        asyncio.run(serve())

    def post(self, path: str, body: dict) -> tuple[float, object]:
        """Seconds from sending the request to its last byte received; parsed afterwards."""
        data = json.dumps(body).encode()
        started = time.perf_counter()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data)
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read()
        return time.perf_counter() - started, json.loads(raw)

    def stop(self) -> None:
        self.process.kill()
        self.process.join()


def pct(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {"p50_ms": round(statistics.median(ms), 3),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3)}  # fmt: skip


def latency(nodes: int, pods: int, seed: int = 7) -> dict:
    server = Server(nodes, seed)
    rnd = random.Random(seed + 1)
    filters, priorities, passed = [], [], []
    try:
        for i in range(pods):
            pod = pod_json(10_000_000 + i, rnd)
            took, result = server.post("/filter", {"Pod": pod, "NodeNames": server.names})
            filters.append(took)
            feasible = result["NodeNames"]
            passed.append(len(feasible))
            if not feasible:
                continue
            took, scores = server.post("/prioritize", {"Pod": pod, "NodeNames": feasible})
            priorities.append(took)
            best = max(scores, key=lambda s: (s["Score"], s["Host"]))["Host"]
            server.post("/bench/reserve", {"Pod": pod, "Node": best})
    finally:
        server.stop()
    return {"nodes": nodes, "gpus": nodes * 8, "pods": pods,
            "mean_feasible_nodes": round(statistics.mean(passed)),
            "filter": pct(filters), "prioritize": pct(priorities)}  # fmt: skip


def bind_like_the_extender(cache: ClusterCache, view: PlacementView, pod: dict, node: str) -> None:
    """What bind records: the core's placement, reserved in the cache."""
    request = parse_pod_request(pod)
    result = fit(request, view.node_state(node, NOW), resolve_policy("binpack"))
    if result.fits:
        assignment = to_pod_assignment(node, result.placements, NOW)
        meta = pod["metadata"]
        cache.reserve(meta["uid"], meta["namespace"], meta["name"], assignment)


def throughput(nodes: int, pods: int) -> dict:
    """Gated pods released at once; seconds until all are bound, per scheduler."""
    from kubernetes import client

    from e2e.cluster import fake_nodes
    from e2e.cluster.local_cluster import LocalCluster
    from e2e.extender_support import ExtenderProcess

    work = Path(tempfile.mkdtemp(prefix="infergrid-bench-"))
    fleet_file = work / "fleet.yaml"
    fleet_file.write_text(
        "version: v1\nnodes:\n- name: seed\n  gpus: {model: NVIDIA L4, count: 1,"
        " memoryMiB: 23034, smCount: 58, computeCapability: '8.9'}\n"
    )
    cluster = LocalCluster(work / "state")
    cluster.up(fleet_file)
    extender = ExtenderProcess(cluster.extender_url(), cluster.kubeconfig, work / "extender.log")
    try:
        api = cluster.api()
        core = client.CoreV1Api(api)
        rnd = random.Random(3)
        bench_nodes = fleet(nodes, rnd)
        fake_nodes.create(api, Fleet(bench_nodes))
        for node in bench_nodes:
            inv = node.inventory
            usage = GpuUsage(inv.node, datetime.now(UTC),
                             tuple(GpuUsageSample(g.uuid, 0, 0) for g in inv.gpus))  # fmt: skip
            core.patch_node(inv.node, {"metadata": {"annotations": {
                ANNOTATION_GPU_INVENTORY: encode_inventory(inv),
                ANNOTATION_GPU_USAGE: encode_usage(usage)}}})  # fmt: skip
        fake_nodes.wait_schedulable(api, cluster.processes, timeout=600)
        runs = {}
        # The extender as deployed (its filter waits for earlier pods' binds), then with
        # bindWaitSeconds 0: what that wait costs in pods/s.
        for label, scheduler, wait in (("default-scheduler", None, "2"),
                                       ("infergrid-scheduler", True, "2"),
                                       ("infergrid-no-wait", True, "0")):  # fmt: skip
            extender.args = ["--stale-after", "3600", "--bind-wait", wait]
            extender.start()
            try:
                runs[label] = release_and_time(core, label, pods, scheduler)
            finally:
                extender.stop()
    finally:
        cluster.down()
    plain, ours, no_wait = (runs[k] for k in runs)
    return {"nodes": nodes, "pods": pods, "pods_per_s_default": round(plain, 1),
            "pods_per_s_extender": round(ours, 1), "ratio": round(ours / plain, 3),
            "pods_per_s_extender_no_wait": round(no_wait, 1),
            "ratio_no_wait": round(no_wait / plain, 3)}  # fmt: skip


def release_and_time(core, namespace: str, pods: int, extender: bool | None) -> float:
    from e2e.cluster.fake_nodes import KWOK_TOLERATION
    from e2e.cluster.processes import wait_until

    core.create_namespace({"metadata": {"name": namespace}})
    wait_until(lambda: core.read_namespaced_service_account("default", namespace), 60, "the SA")
    names = [f"p-{i:04d}" for i in range(pods)]
    for name in names:
        spec = {"schedulingGates": [{"name": "bench"}], "tolerations": [KWOK_TOLERATION],
                "containers": [{"name": "c", "image": "x",
                                "resources": {"limits": {RESOURCE_GPU: "1"}}}]}  # fmt: skip
        if extender:
            spec["schedulerName"] = "infergrid-scheduler"
        core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": spec})
    started = time.perf_counter()
    for name in names:
        core.patch_namespaced_pod(name, namespace, {"spec": {"schedulingGates": None}})

    def all_bound() -> bool:
        return all(p.spec.node_name for p in core.list_namespaced_pod(namespace).items)

    wait_until(all_bound, 900, f"{pods} pods bound by {namespace}")
    return pods / (time.perf_counter() - started)


def print_latency(r: dict) -> None:
    print(f"{r['nodes']:>6} {r['gpus']:>6} {r['mean_feasible_nodes']:>9}"
          f" {r['filter']['p50_ms']:>11.2f} {r['filter']['p99_ms']:>11.2f}"
          f" {r['prioritize']['p50_ms']:>9.2f} {r['prioritize']['p99_ms']:>9.2f}",
          flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,1000,5000")
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--cluster-nodes", type=int, default=1000)
    parser.add_argument("--cluster-pods", type=int, default=500)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.json:
        print(f"{'nodes':>6} {'GPUs':>6} {'feasible':>9} {'filter p50':>11} {'filter p99':>11}"
              f" {'prio p50':>9} {'prio p99':>9}   (ms)")  # fmt: skip
    rows = []
    for n in args.nodes.split(","):
        rows.append(latency(int(n), args.pods))
        if not args.json:
            print_latency(rows[-1])
    through = throughput(args.cluster_nodes, args.cluster_pods) if args.cluster_nodes else None
    if args.json:
        print(json.dumps({"latency": rows, "throughput": through}, indent=2))
    elif through:
        print(f"\nkube-scheduler on {through['nodes']} KWOK nodes, {through['pods']} pods:"
              f" {through['pods_per_s_default']} pods/s without the extender,"
              f" {through['pods_per_s_extender']} pods/s with it"
              f" (ratio {through['ratio']}); {through['pods_per_s_extender_no_wait']} pods/s"
              f" with it and bindWaitSeconds 0 (ratio {through['ratio_no_wait']})")  # fmt: skip


if __name__ == "__main__":
    main()
