"""A re-read workload is taken up only after the recent pod shapes are scored under it, a few
nodes per step between requests: no pod's prioritize pays for scoring every node again, and
the pods meanwhile are scored under the workload in use."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import numpy as np
from aiohttp.test_utils import TestClient, TestServer

from infergrid.constants import POLICY_FGD_CLUSTER_AWARE, RESOURCE_GPU
from infergrid.placement import NodeSet, resolve_policy
from infergrid.placement.learned import WORKLOAD_REFRESH
from infergrid.pod_request import parse_pod_request
from scheduler_extender import decisions
from scheduler_extender import view as view_module
from scheduler_extender.app import ExtenderService
from scheduler_extender.binder import Binder
from scheduler_extender.view import PlacementView
from scheduler_extender.watch_cache import ADDED, ClusterCache
from tests.placement.builders import scored_rows
from tests.scheduler_extender.test_view_changes import NOW, node_json, share_pod

NAMES = [f"n{i}" for i in range(6)]
POLICY = POLICY_FGD_CLUSTER_AWARE


def cluster() -> PlacementView:
    cache = ClusterCache()
    for at, name in enumerate(NAMES):
        cache.apply_node(ADDED, node_json(name, used_mib=1024 * at))
    return PlacementView(cache, timedelta(days=1))


def whole_pod(uid: str) -> dict:
    limits = {RESOURCE_GPU: "1"}
    return {
        "metadata": {"name": uid, "namespace": "t", "uid": uid},
        "spec": {"containers": [{"name": "engine", "resources": {"limits": limits}}]},
    }


def first_pod(view: PlacementView) -> dict[str, int]:
    """A share pod, filtered (its workload, the first, is adopted at once) and scored."""
    decisions.filter_nodes(share_pod(4096), NAMES, view, POLICY, NOW)
    return decisions.prioritize_nodes(share_pod(4096), NAMES, view, POLICY, NOW)


def shift(view: PlacementView) -> None:
    """A run of whole-GPU pods: the distribution moves far enough to be re-read."""
    for at in range(WORKLOAD_REFRESH):
        decisions.filter_nodes(whole_pod(f"w{at}"), NAMES, view, POLICY, NOW)


def test_pods_are_scored_under_the_workload_in_use_until_the_steps_adopt_the_new_one(
    monkeypatch,
):
    monkeypatch.setattr(view_module, "ADOPTION_ROWS", 2)
    view = cluster()
    first = first_pod(view)
    in_use = view.workload()
    shift(view)
    steps = view.adoption()
    assert steps is not None and view.workload() is in_use
    assert decisions.prioritize_nodes(share_pod(4096), NAMES, view, POLICY, NOW) == first
    taken = sum(1 for _ in steps)
    assert taken == len(NAMES) // 2  # one recent shape, two nodes per step
    adopted = view.workload()
    assert adopted is not in_use and view.adoption() is None

    scored = scored_rows(view.nodes)
    request = parse_pod_request(share_pod(4096), POLICY)
    policy = resolve_policy(POLICY, adopted)
    kept = view.nodes.scores(NAMES, request, policy, decisions._host(share_pod(4096)))
    assert scored == []  # the first pod after the adoption finds its scores kept
    fresh = NodeSet()
    for name in NAMES:
        fresh.put(view.node_state(name, NOW), name)
    expected = fresh.scores(NAMES, request, policy, decisions._host(share_pod(4096)))
    assert np.array_equal(kept, expected, equal_nan=True)


def test_a_newer_re_read_during_the_steps_is_the_one_adopted():
    view = cluster()
    first_pod(view)
    shift(view)
    older = view.adoption()
    assert older is not None
    next(older)
    for at in range(3 * WORKLOAD_REFRESH):  # the distribution moves again, to 2-GPU pods
        pod = whole_pod(f"x{at}")
        pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU] = "2"
        decisions.filter_nodes(pod, NAMES, view, POLICY, NOW)
    in_use = view.workload()
    assert list(older) == [] and view.workload() is in_use  # the older one gave up
    newer = view.adoption()
    assert newer is not None
    list(newer)
    assert view.workload() is not in_use and view.adoption() is None


def test_the_service_adopts_between_requests_and_answers_meanwhile():
    view = cluster()
    svc = ExtenderService(view, Binder(None, view, POLICY), POLICY, lambda: True, clock=lambda: NOW)

    async def go() -> None:
        async with TestClient(TestServer(svc.app())) as http:
            body = json.dumps({"Pod": share_pod(4096), "NodeNames": NAMES}).encode()
            for verb in ("/filter", "/prioritize"):
                assert (await http.post(verb, data=body)).status == 200
            in_use = view.workload()
            for at in range(WORKLOAD_REFRESH):
                args = {"Pod": whole_pod(f"w{at}"), "NodeNames": NAMES}
                resp = await http.post("/filter", data=json.dumps(args).encode())
                assert resp.status == 200
            for _ in range(100):
                if view.adoption() is None:
                    break
                await asyncio.sleep(0)
            assert view.adoption() is None and view.workload() is not in_use

    asyncio.run(go())
