"""The watch cache on plain Kubernetes JSON: decoding, events, reservations, relists, versions."""

import json
import threading
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.client.rest import ApiException

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
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
)
from infergrid.inventory import Gpu, GpuInventory, encode_inventory
from infergrid.pod_request import parse_pod_request
from infergrid.records import LIVE_PODS, node_record, pod_record
from infergrid.usage import GpuUsage, GpuUsageSample, encode_usage
from scheduler_extender import watch_cache
from scheduler_extender.watch_cache import ADDED, DELETED, MODIFIED, ClusterCache

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
NODES = ("node-a", "node-b")


def inventory(node: str) -> GpuInventory:
    gpu = Gpu(f"GPU-{node}", 0, "NVIDIA L4", 23034, 58, "8.9", 0, True)
    return GpuInventory(node, (gpu,))


def usage(node: str, used: int = 0) -> GpuUsage:
    return GpuUsage(node, NOW, (GpuUsageSample(f"GPU-{node}", used, 0),))


def assignment(node: str, mib: int = 1024, minute: int = 0) -> PodAssignment:
    share = AssignedGpu(f"GPU-{node}", mib, 10)
    container = ContainerAssignment("main", (share,), shared=True)
    return PodAssignment(node, NOW + timedelta(minutes=minute), (container,))


def node_json(name: str, annotations: dict[str, str] | None = None, **labels: str) -> dict:
    meta = {"name": name, "annotations": annotations, "labels": labels, "resourceVersion": "1"}
    return {"metadata": meta}


def gpu_node(name: str, used: int = 0) -> dict:
    return node_json(
        name,
        {
            ANNOTATION_GPU_INVENTORY: encode_inventory(inventory(name)),
            ANNOTATION_GPU_USAGE: encode_usage(usage(name, used)),
        },
    )


def pod_json(
    uid: str,
    held: PodAssignment | str | None = None,
    phase: str = "Pending",
    version: str = "1",
) -> dict:
    annotations = {}
    if held is not None:
        text = held if isinstance(held, str) else encode_assignment(held)
        annotations[ANNOTATION_GPU_ASSIGNMENT] = text
    return {
        "metadata": {
            "uid": uid,
            "namespace": "ns",
            "name": f"pod-{uid}",
            "resourceVersion": version,
            "annotations": annotations,
        },
        "spec": {"schedulerName": "infergrid-scheduler"},
        "status": {"phase": phase},
    }


@pytest.fixture
def cache() -> ClusterCache:
    return ClusterCache()


# Records: decoding itself is specified in tests/test_records.py.


@pytest.mark.parametrize(
    "node",
    [gpu_node("node-a"), node_json("cpu-0"), node_json("node-a", {ANNOTATION_GPU_USAGE: "{"})],
    ids=["gpu node", "no annotations", "bad annotation"],
)
def test_a_node_is_kept_as_its_record(cache, node):
    cache.apply_node(ADDED, node)
    assert cache.node(node["metadata"]["name"]) == node_record(node)


def test_a_node_naming_another_in_its_inventory_is_kept_with_the_problem(cache):
    node = gpu_node("node-a")
    node["metadata"]["name"] = "node-z"
    cache.apply_node(ADDED, node)
    assert "names 'node-a', not this node 'node-z'" in cache.node("node-z").problem


def test_a_pod_is_kept_as_its_record(cache):
    pod = pod_json("u1", assignment("node-a"))
    cache.apply_pod(ADDED, pod)
    assert cache.pod("u1") == pod_record(pod)


def test_a_bad_assignment_holds_nothing(cache):
    cache.apply_pod(ADDED, pod_json("u1", '{"version":"v1"}'))
    assert cache.pod("u1").problem is not None
    assert cache.size()["assigned_pods"] == 0 and cache.assignments_on("node-a") == []


def test_an_unknown_event_type_is_refused(cache):
    with pytest.raises(ValueError, match="BOOKMARK"):
        cache.apply_pod("BOOKMARK", pod_json("u1"))


# Pod events.


def test_assignments_are_indexed_by_their_node_oldest_first(cache):
    cache.apply_pod(ADDED, pod_json("late", assignment("node-a", minute=5)))
    cache.apply_pod(ADDED, pod_json("early", assignment("node-a", minute=1)))
    cache.apply_pod(ADDED, pod_json("other", assignment("node-b")))
    cache.apply_pod(ADDED, pod_json("none"))
    assert cache.assignments_on("node-a") == [
        assignment("node-a", minute=1),
        assignment("node-a", minute=5),
    ]
    assert cache.size() == {
        "nodes": 0,
        "pods": 4,
        "assigned_pods": 3,
        "reservations": 0,
        "resourceslices": 0,
        "resourceclaims": 0,
    }


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_frees_its_gpus(cache, phase):
    cache.apply_pod(ADDED, pod_json("u1", assignment("node-a")))
    cache.apply_pod(MODIFIED, pod_json("u1", assignment("node-a"), phase=phase, version="2"))
    assert cache.pod("u1") is None and cache.assignments_on("node-a") == []


def test_a_deleted_pod_frees_its_gpus(cache):
    cache.apply_pod(ADDED, pod_json("u1", assignment("node-a")))
    cache.apply_pod(DELETED, pod_json("u1", assignment("node-a")))
    assert cache.pod("u1") is None and cache.assignments_on("node-a") == []


def test_modified_for_an_unseen_pod_adds_it_and_deleted_for_one_is_no_change(cache):
    cache.apply_pod(MODIFIED, pod_json("u1", assignment("node-a")))
    assert cache.assignments_on("node-a") == [assignment("node-a")]
    version = cache.version
    cache.apply_pod(DELETED, pod_json("ghost"))
    assert cache.version == version


# Reservations.


def test_a_reservation_counts_until_the_pod_event_supersedes_it(cache):
    cache.apply_pod(ADDED, pod_json("u1"))
    cache.reserve("u1", "ns", "pod-u1", assignment("node-a"))
    assert cache.assignments_on("node-a") == [assignment("node-a")]
    cache.apply_pod(MODIFIED, pod_json("u1", version="2"))  # an event from before the write
    assert cache.size()["reservations"] == 1
    cache.apply_pod(MODIFIED, pod_json("u1", assignment("node-a"), version="3"))
    assert cache.assignments_on("node-a") == [assignment("node-a")]
    assert cache.size()["reservations"] == 0


def test_reserving_after_the_pod_event_does_not_count_twice(cache):
    cache.apply_pod(ADDED, pod_json("u1", assignment("node-a")))
    cache.reserve("u1", "ns", "pod-u1", assignment("node-a"))
    assert cache.assignments_on("node-a") == [assignment("node-a")]
    assert cache.size()["reservations"] == 0


def test_release_drops_a_reservation_but_not_the_pod(cache):
    cache.apply_pod(ADDED, pod_json("u1"))
    cache.reserve("u1", "ns", "pod-u1", assignment("node-a"))
    cache.release("u1")
    assert cache.assignments_on("node-a") == [] and cache.pod("u1") is not None
    version = cache.version
    cache.release("u1")
    assert cache.version == version


@pytest.mark.parametrize("event, phase", [(DELETED, "Pending"), (MODIFIED, "Failed")])
def test_a_reservation_ends_with_its_pod(cache, event, phase):
    cache.reserve("u1", "ns", "pod-u1", assignment("node-a"))
    cache.apply_pod(event, pod_json("u1", phase=phase))
    assert cache.assignments_on("node-a") == [] and cache.size()["reservations"] == 0


def test_a_relist_ends_reservations_it_answers_for(cache):
    cache.reserve("gone", "ns", "pod-gone", assignment("node-a", minute=1))
    cache.reserve("bound", "ns", "pod-bound", assignment("node-a", minute=2))
    cache.reserve("waiting", "ns", "pod-waiting", assignment("node-a", minute=3))
    listed_at = cache.version
    cache.reserve("young", "ns", "pod-young", assignment("node-a", minute=4))
    pods = [pod_json("bound", assignment("node-a", minute=2)), pod_json("waiting")]
    cache.replace_all_pods(pods, listed_at)
    assert [a.assigned_at.minute for a in cache.assignments_on("node-a")] == [2, 3, 4]
    assert cache.size()["reservations"] == 2
    cache.replace_all_pods(pods)
    assert cache.size()["reservations"] == 1


# Tentative reservations: prioritize's prediction, held until bind, the watch or its deadline.

REQUEST = parse_pod_request(
    {"metadata": {}, "spec": {"containers": [{"name": "c", "resources": {
        "limits": {RESOURCE_VGPU: "1", RESOURCE_GPU_MEMORY: "1024"}}}]}}
)  # fmt: skip


def asking(uid: str, node: str | None, cpu: str, memory: str = "1Gi", phase: str = "Running"):
    """A pod of ``uid`` bound to ``node`` (None: not yet), requesting CPU and memory."""
    pod = pod_json(uid, phase=phase)
    pod["spec"]["containers"] = [
        {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}
    ]
    if node is not None:
        pod["spec"]["nodeName"] = node
    return pod


def test_each_node_sums_what_its_live_pods_request_gpu_or_not(cache):
    cache.apply_node(ADDED, gpu_node("node-a"))
    cache.apply_pod(ADDED, asking("a", None, "2"))
    assert cache.requested_on("node-a") == (0, 0)  # pending: on no node yet
    before = cache.node_version("node-a")
    cache.apply_pod(MODIFIED, asking("a", "node-a", "2"))
    cache.apply_pod(ADDED, asking("b", "node-a", "500m", "512Mi"))
    assert cache.requested_on("node-a") == (2500, 1536)
    assert cache.node_version("node-a") > before  # its state moved: rebuilt at the next call
    cache.apply_pod(MODIFIED, asking("a", "node-a", "2", phase="Succeeded"))
    cache.apply_pod(DELETED, asking("b", "node-a", "500m", "512Mi"))
    assert cache.requested_on("node-a") == (0, 0)


def test_a_relist_recounts_the_requests(cache):
    cache.apply_pod(ADDED, asking("a", "node-a", "2"))
    cache.replace_all_pods([asking("b", "node-b", "1")])
    assert (cache.requested_on("node-a"), cache.requested_on("node-b")) == ((0, 0), (1000, 1024))


def hold(cache: ClusterCache, uid: str, node: str = "node-a", until: float = 10.0) -> bool:
    return cache.hold(uid, "ns", f"pod-{uid}", assignment(node), REQUEST, until)


def bound_pod(uid: str, node: str, held: PodAssignment | None = None) -> dict:
    pod = pod_json(uid, held, version="2")
    pod["spec"]["nodeName"] = node
    return pod


def test_a_tentative_reservation_takes_its_gpus_but_is_not_a_binds(cache):
    version = cache.node_version("node-a")
    assert hold(cache, "u1")
    assert cache.assignments_on("node-a") == [assignment("node-a")]
    assert cache.node_version("node-a") > version  # filters rebuild the node at once
    assert not cache.reserved("u1")
    held = cache.tentative("u1")
    assert held is not None and held.node == "node-a" and held.request == REQUEST


def test_a_new_hold_of_the_pod_replaces_its_old_one(cache):
    hold(cache, "u1", "node-a")
    hold(cache, "u1", "node-b")
    assert cache.assignments_on("node-a") == []
    assert cache.assignments_on("node-b") == [assignment("node-b")]


def test_no_hold_where_the_pod_already_has_its_gpus_or_is_bound(cache):
    cache.reserve("u1", "ns", "pod-u1", assignment("node-a"))  # bind holds them
    cache.apply_pod(ADDED, pod_json("u2", assignment("node-a")))  # its annotation holds them
    cache.apply_pod(ADDED, bound_pod("u3", "node-a"))  # bound by someone else
    assert not any(hold(cache, uid, "node-b") for uid in ("u1", "u2", "u3"))
    assert cache.assignments_on("node-b") == []
    assert all(cache.tentative(uid) is None for uid in ("u1", "u2", "u3"))


def test_confirm_turns_a_hold_into_a_binds_reservation_that_never_runs_out(cache):
    hold(cache, "u1", until=10.0)
    version = cache.version
    assert cache.confirm("u1")
    assert cache.version == version  # the same GPUs stay taken: nothing to rebuild
    assert cache.reserved("u1") and cache.tentative("u1") is None
    assert cache.expire_tentative(now=1e9) == []
    assert cache.assignments_on("node-a") == [assignment("node-a")]
    assert not cache.confirm("u1") and not cache.confirm("nobody")


def test_release_tentative_never_drops_a_binds_reservation(cache):
    hold(cache, "u1")
    cache.reserve("u2", "ns", "pod-u2", assignment("node-b"))
    assert cache.release_tentative("u1") and not cache.release_tentative("u1")
    assert not cache.release_tentative("u2")
    assert cache.assignments_on("node-a") == [] and cache.reserved("u2")


@pytest.mark.parametrize(
    ("until", "now", "due"),
    [(10.0, 9.999, False), (10.0, 10.0, True), (10.0, 10.001, True), (0.0, 0.0, True)],
)
def test_a_hold_runs_out_at_its_deadline(until, now, due):
    assert watch_cache.is_due(until, now) is due


def test_expiry_drops_the_holds_that_ran_out_and_only_those(cache):
    hold(cache, "early", "node-a", until=5.0)
    hold(cache, "late", "node-b", until=20.0)
    hold(cache, "moved", "node-a", until=6.0)
    hold(cache, "moved", "node-b", until=30.0)  # held again: the old deadline is void
    assert cache.expire_tentative(now=4.0) == []
    assert cache.expire_tentative(now=10.0) == ["early"]
    assert cache.tentative("moved") is not None and cache.tentative("late") is not None
    assert cache.expire_tentative(now=30.0) == ["late", "moved"]
    assert cache.size()["reservations"] == 0


def test_expiry_skips_holds_already_confirmed_or_released(cache):
    hold(cache, "confirmed", until=5.0)
    hold(cache, "released", until=5.0)
    cache.confirm("confirmed")
    cache.release_tentative("released")
    assert cache.expire_tentative(now=10.0) == []
    assert cache.reserved("confirmed")


@pytest.mark.parametrize(
    "event",
    [(DELETED, pod_json("u1")), (MODIFIED, pod_json("u1", phase="Failed")),
     (MODIFIED, bound_pod("u1", "node-b")), (MODIFIED, pod_json("u1", assignment("node-b")))],
    ids=["deleted", "finished", "bound by someone else", "assigned by someone else"],
)  # fmt: skip
def test_the_watch_ends_a_hold_whose_pod_went_another_way(cache, event):
    hold(cache, "u1", "node-a")
    cache.apply_pod(*event)
    assert cache.tentative("u1") is None and cache.assignments_on("node-a") == []


def test_the_watch_keeps_a_hold_while_the_pod_waits_and_a_confirmed_one_once_it_is_bound(cache):
    hold(cache, "u1", "node-a")
    cache.apply_pod(MODIFIED, pod_json("u1", version="2"))  # not bound yet
    assert cache.tentative("u1") is not None
    cache.confirm("u1")
    cache.apply_pod(MODIFIED, bound_pod("u1", "node-a"))  # the Binding before the annotation
    assert cache.reserved("u1") and cache.assignments_on("node-a") == [assignment("node-a")]


def test_a_relist_ends_a_hold_whose_pod_is_bound_or_gone_and_keeps_one_still_waiting(cache):
    hold(cache, "bound", "node-a")
    hold(cache, "gone", "node-a")
    hold(cache, "waiting", "node-b")
    cache.replace_all_pods([bound_pod("bound", "node-b"), pod_json("waiting")], cache.version)
    assert cache.tentative("bound") is None and cache.tentative("gone") is None
    assert cache.tentative("waiting") is not None


# Versions.


def test_node_version_moves_with_its_annotations_only(cache):
    cache.apply_node(ADDED, gpu_node("node-a"))
    first = cache.node_version("node-a")
    assert first > 0
    cache.apply_node(MODIFIED, {**gpu_node("node-a"), "status": {"phase": "Running"}})
    assert cache.node_version("node-a") == first
    cache.apply_node(MODIFIED, gpu_node("node-a", used=700))
    assert cache.node_version("node-a") > first


def test_node_version_moves_with_the_assignments_on_it(cache):
    cache.apply_node(ADDED, gpu_node("node-a"))
    cache.apply_node(ADDED, gpu_node("node-b"))
    steps = [
        lambda: cache.apply_pod(ADDED, pod_json("u1", assignment("node-a"))),
        lambda: cache.reserve("u2", "ns", "pod-u2", assignment("node-a", minute=1)),
        lambda: cache.release("u2"),
        lambda: cache.apply_pod(DELETED, pod_json("u1")),
    ]
    for step in steps:
        a, b = cache.node_version("node-a"), cache.node_version("node-b")
        step()
        assert cache.node_version("node-a") > a and cache.node_version("node-b") == b


def test_a_pod_change_that_keeps_its_assignment_keeps_node_version(cache):
    cache.apply_pod(ADDED, pod_json("u1", assignment("node-a")))
    before, version = cache.node_version("node-a"), cache.version
    cache.apply_pod(MODIFIED, pod_json("u1", assignment("node-a"), phase="Running", version="2"))
    assert cache.node_version("node-a") == before and cache.version > version


def test_a_deleted_node_reads_zero_and_comes_back_newer(cache):
    cache.apply_node(ADDED, gpu_node("node-a"))
    first = cache.node_version("node-a")
    cache.apply_node(DELETED, gpu_node("node-a"))
    assert cache.node("node-a") is None and cache.node_version("node-a") == 0
    cache.apply_node(ADDED, gpu_node("node-a"))
    assert cache.node_version("node-a") > first


def test_an_unchanged_relist_changes_no_version(cache):
    nodes, pods = [gpu_node("node-a")], [pod_json("u1", assignment("node-a"))]
    cache.replace_all_nodes(nodes)
    cache.replace_all_pods(pods)
    version, node_version = cache.version, cache.node_version("node-a")
    cache.replace_all_nodes(nodes)
    cache.replace_all_pods(pods)
    assert (cache.version, cache.node_version("node-a")) == (version, node_version)


def test_synced_after_every_kind_is_listed(cache):
    assert not cache.wait_synced(0)
    cache.replace_all_nodes([])
    cache.replace_all_pods([])
    cache.replace_all_slices([])
    assert not cache.synced()
    cache.replace_all_claims([])
    assert cache.synced() and cache.wait_synced(0)


# Relist equals incremental, over random histories.

NODE_VARIANTS = [
    gpu_node("node-a"),
    gpu_node("node-a", used=900),
    node_json("node-a", {ANNOTATION_GPU_INVENTORY: "{"}),
    gpu_node("node-b"),
    {**gpu_node("node-b"), "status": {"allocatable": {"cpu": "32", "memory": "64Gi"}}},
    node_json("node-b", zone="z1"),
    node_json("node-c"),
]
POD_VARIANTS = [
    pod_json(uid, held, phase, version)
    for uid in ("u1", "u2", "u3")
    for held in (None, assignment("node-a"), assignment("node-b", 2048), "{")
    for phase in ("Pending", "Running", "Succeeded")
    for version in ("1", "2")
]
EVENTS = st.one_of(
    st.tuples(
        st.just("node"), st.sampled_from([ADDED, MODIFIED, DELETED]), st.sampled_from(NODE_VARIANTS)
    ),
    st.tuples(
        st.just("pod"), st.sampled_from([ADDED, MODIFIED, DELETED]), st.sampled_from(POD_VARIANTS)
    ),
)


def key(kind: str, obj: dict) -> str:
    return obj["metadata"]["name" if kind == "node" else "uid"]


def apply(cache: ClusterCache, event: tuple[str, str, dict]) -> None:
    kind, event_type, obj = event
    (cache.apply_node if kind == "node" else cache.apply_pod)(event_type, obj)


def snapshot(cache: ClusterCache) -> tuple:
    pods = {uid: cache.pod(uid) for uid in ("u1", "u2", "u3")}
    nodes = ("node-a", "node-b", "node-c")
    assignments = {n: cache.assignments_on(n) for n in nodes}
    return cache.nodes(), pods, assignments, cache.size(), cache.gpu_totals()


def totals(cache: ClusterCache) -> tuple[dict[str, int], int]:
    """``gpu_totals`` summed from scratch over the node records."""
    per_model: dict[str, int] = {}
    cpu = 0
    for record in cache.nodes().values():
        if record.inventory is not None and record.inventory.gpus:
            cpu += record.cpu_milli
            for gpu in record.inventory.gpus:
                per_model[gpu.model] = per_model.get(gpu.model, 0) + 1
    return per_model, cpu


def node_view(cache: ClusterCache, node: str) -> tuple:
    return cache.node(node), cache.assignments_on(node)


@settings(max_examples=300, deadline=None)
@given(history=st.lists(EVENTS, max_size=30), earlier=st.lists(EVENTS, max_size=10))
def test_a_relist_equals_the_events_it_replaces(history, earlier):
    incremental = ClusterCache()
    latest: dict[tuple[str, str], dict] = {}
    for kind, event_type, obj in history:
        apply(incremental, (kind, event_type, obj))
        if event_type == DELETED:
            latest.pop((kind, key(kind, obj)), None)
        else:
            latest[(kind, key(kind, obj))] = obj
    nodes = [obj for (kind, _), obj in latest.items() if kind == "node"]
    pods = [obj for (kind, _), obj in latest.items() if kind == "pod"]
    fresh, stale = ClusterCache(), ClusterCache()
    for event in earlier:
        apply(stale, event)
    assert incremental.gpu_totals() == totals(incremental)
    for relisted in (fresh, stale):
        relisted.replace_all_nodes(nodes)
        relisted.replace_all_pods(pods)
        assert snapshot(relisted) == snapshot(incremental)


@settings(max_examples=300, deadline=None)
@given(history=st.lists(EVENTS, max_size=30))
def test_node_version_moves_exactly_when_its_view_changes(history):
    cache = ClusterCache()
    names = ("node-a", "node-b", "node-c")
    for event in history:
        before = {n: (node_view(cache, n), cache.node_version(n)) for n in names}
        apply(cache, event)
        for name, (view, version) in before.items():
            assert (node_view(cache, name) != view) == (cache.node_version(name) != version)


@settings(max_examples=300, deadline=None)
@given(history=st.lists(EVENTS, max_size=30), log=st.sampled_from((3, watch_cache.CHANGE_LOG)))
def test_changed_since_names_every_node_whose_view_changed(history, log):
    """From any earlier version: every node seen to change is named, and no node whose
    version stayed; or the answer is None as more changes came since than the log holds."""
    with patch.object(watch_cache, "CHANGE_LOG", log):
        cache = ClusterCache()
    names = ("node-a", "node-b", "node-c")
    seen = [(cache.version, {n: node_view(cache, n) for n in names})]
    for event in history:
        apply(cache, event)
        seen.append((cache.version, {n: node_view(cache, n) for n in names}))
    for version, views in seen:
        changed = cache.changed_since(version)
        if changed is None:
            assert cache.version - version > log
            continue
        assert {n for n in names if node_view(cache, n) != views[n]} <= changed
        assert all(cache.node_version(n) <= version for n in names if n not in changed)


def test_changed_since_names_reserved_released_and_relisted_nodes(cache):
    cache.replace_all_nodes([gpu_node("node-a"), gpu_node("node-b")])
    start = cache.version
    assert cache.changed_since(start) == frozenset()
    cache.reserve("u1", "ns", "pod-u1", assignment("node-a"))
    reserved = cache.version
    assert cache.changed_since(start) == {"node-a"}
    cache.release("u1")
    assert cache.changed_since(reserved) == {"node-a"}
    cache.replace_all_nodes([gpu_node("node-a"), gpu_node("node-b", used=900)])
    assert cache.changed_since(reserved) == {"node-a", "node-b"}
    assert cache.changed_since(-1) is None


# The list+watch loop, against scripted API responses.


class FakeWatchResponse:
    """A watch body: one JSON event per line, as the API server streams it."""

    def __init__(self, events: list[dict]) -> None:
        self.lines = [json.dumps(e).encode() + b"\n" for e in events]

    def __iter__(self):
        return iter(self.lines)

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


class ScriptedCore:
    """list_node and list_pod_for_all_namespaces answering from scripts, then idling."""

    def __init__(self, nodes: list, stop: threading.Event, serves_dra: bool = True) -> None:
        self.serves_dra = serves_dra
        self.scripts = {
            "nodes": nodes,
            "pods": [listing([])],
            "resourceslices": [listing([])],
            "resourceclaims": [listing([])],
        }
        self.stop = stop
        self.done = threading.Event()
        self.calls: list[dict[str, Any]] = []

    def get_api_resources(self, **params):
        """Discovery of resource.k8s.io/v1: a 404 where the API server does not serve it."""
        if not self.serves_dra:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(resources=[])

    def list_node(self, **params):
        return self._answer("nodes", params)

    def list_pod_for_all_namespaces(self, **params):
        return self._answer("pods", params)

    def list_resource_slice(self, **params):
        return self._answer("resourceslices", params)

    def list_resource_claim_for_all_namespaces(self, **params):
        return self._answer("resourceclaims", params)

    def _answer(self, kind: str, params: dict):
        self.calls.append({"kind": kind, **params})
        script = self.scripts[kind]
        if script:
            answer = script.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer
        if kind == "nodes":
            self.done.set()
        self.stop.wait(0.05)
        return FakeWatchResponse([])


def test_an_api_server_without_dra_has_no_slices_or_claims_to_wait_for(monkeypatch):
    """Before Kubernetes 1.34 there is no resource.k8s.io/v1: the extender still syncs and
    places by the device plugin's annotations, and never lists what is not served."""
    stop = threading.Event()
    core = ScriptedCore([listing([gpu_node("node-a")])], stop, serves_dra=False)
    monkeypatch.setattr(watch_cache.client, "CoreV1Api", lambda api: core)
    monkeypatch.setattr(watch_cache.client, "ResourceV1Api", lambda api: core)
    cache = ClusterCache(watch_timeout_s=1)
    cache.start(None, stop)
    try:
        assert cache.wait_synced(5)
        assert core.done.wait(10)
    finally:
        stop.set()
    assert set(cache.nodes()) == {"node-a"}
    assert {c["kind"] for c in core.calls} == {"nodes", "pods"}


def listing(items: list[dict], version: str = "10") -> SimpleNamespace:
    body = {"metadata": {"resourceVersion": version}, "items": items}
    return SimpleNamespace(data=json.dumps(body).encode())


def test_the_loop_relists_on_gone_and_reconnects_after_errors(monkeypatch):
    stop = threading.Event()
    gone = {
        "type": "ERROR",
        "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "old"},
    }
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "31"}}}
    core = ScriptedCore(
        [
            listing([gpu_node("node-a")]),
            FakeWatchResponse([{"type": ADDED, "object": gpu_node("node-c")}, gone]),
            ApiException(status=500, reason="boom"),
            listing([gpu_node("node-a"), gpu_node("node-b")], version="30"),
            FakeWatchResponse([bookmark]),
        ],
        stop,
    )
    monkeypatch.setattr(watch_cache.client, "CoreV1Api", lambda api: core)
    monkeypatch.setattr(watch_cache.client, "ResourceV1Api", lambda api: core)
    cache = ClusterCache(watch_timeout_s=1)
    cache.start(None, stop)
    try:
        assert cache.wait_synced(5)
        assert core.done.wait(10)
    finally:
        stop.set()
    assert set(cache.nodes()) == {"node-a", "node-b"}
    assert cache.reconnects == 2
    node_calls = [c for c in core.calls if c["kind"] == "nodes"]
    versions = [c.get("resource_version") for c in node_calls[:6]]
    assert versions == [None, "10", None, None, "30", "31"]
    assert all(c["field_selector"] == LIVE_PODS for c in core.calls if c["kind"] == "pods")
    slices = [c for c in core.calls if c["kind"] == "resourceslices"]
    assert slices and all(c["field_selector"] == "spec.driver=gpu.infergrid.io" for c in slices)
