"""The view never answers from a node's old state: every bind, release and watch event
between two calls shows in the next one.

The view rechecks only the nodes the cache's change log names, so each test runs
with the offer index and without it (every node through ``fit``, memoised), and
with a change log too short to reach back, where every node is reread.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from unittest.mock import patch

import pytest

from infergrid.assignment_annotation import (
    AssignedGpu,
    ContainerAssignment,
    PodAssignment,
    encode_assignment,
)
from infergrid.constants import (
    ANNOTATION_GPU_ASSIGNMENT,
    ANNOTATION_GPU_INVENTORY,
    ANNOTATION_GPU_USAGE,
    LABEL_GPU_PRODUCT,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
)
from infergrid.inventory import Gpu, GpuInventory, encode_inventory
from infergrid.placement import Verdicts, offers, resolve_policy
from infergrid.pod_request import parse_pod_request
from infergrid.usage import GpuUsage, GpuUsageSample, encode_usage
from scheduler_extender import decisions, watch_cache
from scheduler_extender.view import PlacementView
from scheduler_extender.watch_cache import ADDED, DELETED, MODIFIED, ClusterCache

NOW = datetime(2026, 1, 1, tzinfo=UTC)
NAMES = ["a", "b"]
L4_MIB = 23034
BINPACK = resolve_policy("binpack")


def node_json(name: str, used_mib: int = 0) -> dict:
    gpu = Gpu(f"GPU-{name}", 0, "NVIDIA L4", L4_MIB, 58, "8.9", 0, True)
    usage = GpuUsage(name, NOW, (GpuUsageSample(f"GPU-{name}", used_mib, 0),))
    annotations = {
        ANNOTATION_GPU_INVENTORY: encode_inventory(GpuInventory(name, (gpu,))),
        ANNOTATION_GPU_USAGE: encode_usage(usage),
    }
    return {"metadata": {"name": name, "annotations": annotations}}


def share(node: str, mib: int) -> PodAssignment:
    container = ContainerAssignment("engine", (AssignedGpu(f"GPU-{node}", mib, 0),), shared=True)
    return PodAssignment(node, NOW, (container,))


def assigned_pod(uid: str, node: str, mib: int) -> dict:
    annotations = {ANNOTATION_GPU_ASSIGNMENT: encode_assignment(share(node, mib))}
    return {
        "metadata": {"uid": uid, "namespace": "t", "name": uid, "resourceVersion": "1",
                     "annotations": annotations},
        "spec": {"nodeName": node, "schedulerName": "infergrid-scheduler"},
        "status": {"phase": "Running"},
    }  # fmt: skip


def share_pod(mib: int) -> dict:
    limits = {RESOURCE_VGPU: "1", RESOURCE_GPU_MEMORY: str(mib)}
    return {
        "metadata": {"name": "p", "namespace": "t", "uid": "p"},
        "spec": {"containers": [{"name": "engine", "resources": {"limits": limits}}]},
    }


@pytest.fixture(
    params=[(offers.MAX_GPUS, watch_cache.CHANGE_LOG), (0, watch_cache.CHANGE_LOG), (8, 1)],
    ids=["indexed", "through-fit", "short-log"],
)
def cache(request) -> Iterator[ClusterCache]:
    """Two one-L4 nodes; MAX_GPUS 0 keeps every node out of the offer index."""
    widest, log = request.param
    with patch.object(offers, "MAX_GPUS", widest), patch.object(watch_cache, "CHANGE_LOG", log):
        cache = ClusterCache()
        for name in NAMES:
            cache.apply_node(ADDED, node_json(name))
        yield cache


@pytest.fixture
def view(cache: ClusterCache) -> PlacementView:
    return PlacementView(cache, timedelta(seconds=30))


def filtered(view: PlacementView, mib: int = 16384) -> Verdicts:
    rows, missing = view.current(NAMES, NOW)
    found = view.nodes.filter(NAMES, parse_pod_request(share_pod(mib)), BINPACK, rows, missing)
    view.remember(found, len(NAMES))
    return found


def scored(view: PlacementView, names: list[str], mib: int = 4096) -> list[float]:
    rows, _ = view.current(names, NOW)
    request = parse_pod_request(share_pod(mib))
    return view.nodes.scores(names, request, BINPACK, rows=rows).tolist()


def test_a_bind_between_filters_rejects_with_the_new_reason(cache, view):
    assert filtered(view).passed == NAMES
    cache.reserve("u1", "t", "u1", share("a", 16384))
    after = filtered(view)
    assert after.passed == ["b"]
    assert after.failed == {"a": "container 'engine': GPU-a (index 0): 6650 MiB free, needs 16384"}


def test_a_released_reservation_frees_its_node_again(cache, view):
    cache.reserve("u1", "t", "u1", share("a", 16384))
    assert filtered(view).passed == ["b"]
    cache.release("u1")
    assert filtered(view).passed == NAMES


def test_pod_events_between_filters_take_and_free_the_gpu(cache, view):
    assert filtered(view).passed == NAMES
    cache.apply_pod(ADDED, assigned_pod("u1", "b", 20000))
    assert "3034 MiB free, needs 16384" in filtered(view).failed["b"]
    cache.apply_pod(DELETED, assigned_pod("u1", "b", 20000))
    assert filtered(view).passed == NAMES


def test_node_events_between_filters_change_the_answer(cache, view):
    assert filtered(view).passed == NAMES
    cache.apply_node(MODIFIED, node_json("a", used_mib=10000))
    assert "13034 MiB free, needs 16384 (10000 MiB measured in use" in filtered(view).failed["a"]
    cache.apply_node(DELETED, node_json("a"))
    assert "not in the extender's cache" in filtered(view).unresolvable["a"]
    cache.apply_node(ADDED, node_json("a"))
    assert filtered(view).passed == NAMES


def test_prioritize_after_a_bind_scores_the_new_state(cache, view):
    passed = filtered(view, 4096).passed
    before = scored(view, passed)
    cache.reserve("u1", "t", "u1", share("a", 8192))
    after = scored(view, passed)
    assert after[0] > before[0] and after[1] == before[1]
    cache.reserve("u2", "t", "u2", share("b", 20000))
    last = scored(view, passed)
    assert last[0] == after[0] and math.isnan(last[1])


def test_many_changes_between_calls_are_all_seen(cache, view):
    assert filtered(view, 1024).passed == NAMES
    for at in range(5):
        cache.reserve(f"u{at}", "t", f"u{at}", share(NAMES[at % 2], 4096))
    assert filtered(view, 12000).passed == ["b"]
    failed = filtered(view, 16384).failed
    assert "10746 MiB free" in failed["a"] and "14842 MiB free" in failed["b"]


def test_the_learned_workload_reads_the_cluster_and_each_pods_cpu_and_models(cache, view):
    """fgd-cluster-aware's inputs come from the extender's own cache: the GPUs and CPU of the
    node list, and the CPU and GPU models of the pods it is asked about."""
    for name in NAMES:
        node = node_json(name)
        node["status"] = {"allocatable": {"cpu": "7500m"}}
        cache.apply_node(MODIFIED, node)
    cache.apply_node(
        ADDED, {"metadata": {"name": "cpu-only"}, "status": {"allocatable": {"cpu": "64"}}}
    )
    pod = share_pod(4096)
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}
    pod["spec"]["nodeSelector"] = {LABEL_GPU_PRODUCT: "NVIDIA-L4"}
    decisions.filter_nodes(pod, NAMES, view, "binpack", NOW)
    workload = view.workload()
    ((demand, _),) = workload.tasks
    assert (demand.cpu_milli, demand.gpu_models) == (2000, {"NVIDIA-L4"})
    assert workload.cluster_cpu_per_gpu == 7500  # the CPU-only node's CPU feeds no GPU
