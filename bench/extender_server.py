"""One extender, as the latency bench measures it: a mixed cache, the real app, HTTP.

Run as a script by ``bench/extender_latency.py`` with ``PYTHONPATH`` naming the source tree
to measure (this checkout, or an earlier revision's), so old and new code serve the same
cache and the same pods in one run; it imports only what both revisions have. It prints
``{"port": ..., "names": [...]}`` on one line once it serves.

    PYTHONPATH=TREE python bench/extender_server.py --nodes 5000 --policy binpack
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import sys
from datetime import UTC, datetime, timedelta

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
from infergrid.fleet import parse_fleet
from infergrid.inventory import encode_inventory
from infergrid.placement import build_node_state, fit, resolve_policy, to_pod_assignment
from infergrid.pod_request import parse_pod_request
from infergrid.usage import GpuUsage, GpuUsageSample, encode_usage
from scheduler_extender import app as extender_app
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


# The seeded pods' priorities: offline work (0), and online work that a preemptor of
# ONLINE_PRIORITY + 1 may not evict.
ONLINE_PRIORITY = 1000
SEED_PRIORITIES = (0, 0, ONLINE_PRIORITY)


def pod_json(i: int, rnd: random.Random, shape: int | None = None) -> dict:
    """Pod ``i`` of a random shape (weighted), or of ``SHAPES[shape]``."""
    chosen = SHAPES[shape] if shape is not None else None
    limits, annotations, _ = chosen or rnd.choices(SHAPES, weights=[s[2] for s in SHAPES])[0]
    return {
        "metadata": {"name": f"pod-{i}", "namespace": "bench", "uid": f"uid-{i}",
                     "annotations": dict(annotations)},
        "spec": {"containers": [{"name": "engine", "resources": {
            "limits": dict(limits), "requests": {"cpu": "4", "memory": "16Gi"}}}]},
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
                "spec": {"nodeName": inv.node, "schedulerName": "infergrid-scheduler",
                         "priority": rnd.choice(SEED_PRIORITIES)},
                "status": {"phase": "Running"},
            })  # fmt: skip
        cache.apply_node(ADDED, {"metadata": {"name": inv.node, "annotations": {
            ANNOTATION_GPU_INVENTORY: encode_inventory(inv),
            ANNOTATION_GPU_USAGE: encode_usage(usage),
        }}, "status": {"allocatable": {"cpu": "96", "memory": "1Ti"}}})  # fmt: skip
    return cache


def service(cache: ClusterCache, view: PlacementView, policy: str) -> web.Application:
    """The app as main.py builds it, with tentative reservations where the revision has
    them (and then bind confirms the hold, as it does), plus the bench's bind route."""
    binder = Binder(None, view, policy)
    reserver = None
    if hasattr(extender_app, "Reserver"):
        reserver = extender_app.Reserver(view, policy, 10.0)
    extra = {"reserver": reserver} if reserver is not None else {}
    app = extender_app.ExtenderService(view, binder, policy, lambda: True, **extra).app()

    async def reserve(request: web.Request) -> web.Response:
        body = await request.json()
        pod, node = body["Pod"], body["Node"]
        uid = pod["metadata"]["uid"]
        held = cache.tentative(uid) if hasattr(cache, "tentative") else None
        if held is not None and held.node == node:
            cache.confirm(uid)
        else:
            if held is not None:
                cache.release_tentative(uid)
            bind_like_the_extender(cache, view, pod, node, policy)
        return web.json_response({})

    app.router.add_post("/bench/reserve", reserve)
    return app


def bind_like_the_extender(
    cache: ClusterCache, view: PlacementView, pod: dict, node: str, policy: str
) -> None:
    """What bind records: the core's placement, reserved in the cache."""
    request = parse_pod_request(pod)
    result = fit(request, view.node_state(node, NOW), resolve_policy(policy, view.workload()))
    if result.fits:
        assignment = to_pod_assignment(node, result.placements, NOW)
        meta = pod["metadata"]
        cache.reserve(meta["uid"], meta["namespace"], meta["name"], assignment)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--policy", default="binpack")
    args = parser.parse_args()
    cache = mixed_cache(args.nodes, random.Random(args.seed))
    view = PlacementView(cache, timedelta(days=1))
    app = service(cache, view, args.policy)
    if hasattr(view, "prepare"):  # as the extender does once synced, before it is ready
        view.prepare(NOW)
    gc.collect()
    gc.freeze()

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        print(json.dumps({"port": port, "names": sorted(cache.nodes())}), flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    sys.exit(main())
