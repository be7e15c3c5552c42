"""The watch cache keeps one ledger across device-plugin and DRA nodes: a node's inventory
from its annotation or its slices, and what allocated claims hold joining the assignments."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infergrid.assignment_annotation import AssignedGpu, ContainerAssignment, PodAssignment
from infergrid.records import BOTH_MODES
from scheduler_extender.claims import CLAIM_HOLDER
from scheduler_extender.watch_cache import ADDED, DELETED, MODIFIED, ClusterCache
from tests.scheduler_extender.dra_objects import (
    A100_MIB,
    claim,
    claim_pod,
    gpu,
    resource_slice,
    result,
    share_request,
    whole_request,
)
from tests.scheduler_extender.test_watch_cache import NOW, gpu_node, node_json


@pytest.fixture()
def cache() -> ClusterCache:
    cache = ClusterCache()
    cache.apply_node(ADDED, node_json("dra-a"))
    cache.apply_slice(ADDED, resource_slice("dra-a", [gpu(0), gpu(1)]))
    return cache


def share_claim(name: str, device: str, mib: int, *reserved: str) -> dict:
    return claim(name, [share_request()], [result(device, memory_mib=mib)], reserved)


def held_mib(cache: ClusterCache, node: str = "dra-a") -> dict[str, int]:
    found: dict[str, int] = {}
    for held in cache.assignments_on(node):
        for container in held.containers:
            for g in container.gpus:
                found[g.uuid] = found.get(g.uuid, 0) + g.memory_mib
    return found


def test_a_node_with_slices_offers_their_gpus():
    cache = ClusterCache()
    cache.apply_node(ADDED, node_json("dra-a"))
    assert cache.node("dra-a").inventory is None and cache.dra_nodes() == frozenset()
    cache.apply_slice(ADDED, resource_slice("dra-a", [gpu(0), gpu(1)]))
    record = cache.node("dra-a")
    assert record.dra and [g.uuid for g in record.inventory.gpus] == ["GPU-dra-a-0", "GPU-dra-a-1"]
    assert cache.dra_nodes() == {"dra-a"}
    assert cache.gpu_totals()[0] == {"NVIDIA A100-SXM4-80GB": 2}


def test_slices_of_a_node_not_listed_wait_for_it():
    cache = ClusterCache()
    cache.apply_slice(ADDED, resource_slice("dra-a", [gpu(0)]))
    assert cache.node("dra-a") is None
    cache.apply_node(ADDED, node_json("dra-a"))
    assert cache.node("dra-a").dra


def test_a_node_with_both_the_annotation_and_slices_is_a_problem_that_offers_nothing():
    cache = ClusterCache()
    cache.apply_node(ADDED, gpu_node("node-a"))
    cache.apply_slice(ADDED, resource_slice("node-a", [gpu(0)]))
    record = cache.node("node-a")
    assert record.inventory is None and BOTH_MODES in record.problem
    assert cache.gpu_totals()[0] == {}
    cache.apply_slice(DELETED, resource_slice("node-a", [gpu(0)]))
    assert cache.node("node-a").problem is None and not cache.node("node-a").dra


def test_allocated_claims_join_the_nodes_assignments(cache):
    version = cache.node_version("dra-a")
    cache.apply_claim(ADDED, share_claim("a", "gpu-0", 20480, "pod-a"))
    cache.apply_claim(ADDED, claim("w", [whole_request()], [result("gpu-1")], ("pod-w",)))
    assert cache.node_version("dra-a") > version
    assert held_mib(cache) == {"GPU-dra-a-0": 20480, "GPU-dra-a-1": A100_MIB}
    cache.apply_claim(DELETED, claim("w", [whole_request()], [result("gpu-1")], ("pod-w",)))
    assert held_mib(cache) == {"GPU-dra-a-0": 20480}


def test_a_pending_claim_holds_nothing_and_an_allocated_one_holds_before_its_pod_is_bound(cache):
    cache.apply_claim(ADDED, claim("a", [share_request()]))
    assert cache.assignments_on("dra-a") == []
    cache.apply_claim(MODIFIED, share_claim("a", "gpu-0", 1024))
    ((uid, pod, _),) = cache.holders_on("dra-a")
    assert uid == f"{CLAIM_HOLDER}claim-a" and pod is None  # charged to itself: never a victim


def test_a_claim_is_charged_to_its_one_pod_and_a_shared_one_to_itself(cache):
    cache.apply_pod(ADDED, claim_pod("pod-a", {"gpu": "a"}, node="dra-a"))
    cache.apply_claim(ADDED, share_claim("a", "gpu-0", 1024, "pod-a"))
    cache.apply_claim(ADDED, share_claim("b", "gpu-0", 2048, "pod-a"))
    cache.apply_claim(ADDED, share_claim("s", "gpu-1", 4096, "pod-x", "pod-y"))
    holders = {uid: (pod, a) for uid, pod, a in cache.holders_on("dra-a")}
    assert set(holders) == {"pod-a", f"{CLAIM_HOLDER}claim-s"}
    pod, held = holders["pod-a"]
    assert pod.uid == "pod-a" and len(held.containers) == 2


def test_claims_read_before_their_slices_hold_once_the_slices_come():
    cache = ClusterCache()
    cache.apply_node(ADDED, node_json("dra-a"))
    cache.apply_claim(ADDED, share_claim("a", "gpu-0", 1024, "pod-a"))
    assert cache.assignments_on("dra-a") == []
    cache.apply_slice(ADDED, resource_slice("dra-a", [gpu(0)]))
    assert held_mib(cache) == {"GPU-dra-a-0": 1024}


def test_a_reservation_ends_once_the_pods_claims_hold_its_devices(cache):
    container = ContainerAssignment("gpu/gpu", (AssignedGpu("GPU-dra-a-0", 1024, 0),), shared=True)
    share = PodAssignment("dra-a", NOW, (container,))
    cache.hold("pod-a", "default", "pod-a", share, None, until=1e9)
    assert cache.size()["reservations"] == 1
    cache.apply_claim(ADDED, share_claim("a", "gpu-1", 2048, "pod-a"))
    assert cache.size()["reservations"] == 0
    assert held_mib(cache) == {"GPU-dra-a-1": 2048}
    cache.reserve("pod-a", "default", "pod-a", share)  # the claims hold: nothing more to hold
    assert not cache.hold("pod-a", "default", "pod-a", share, None, until=1e9)
    assert held_mib(cache) == {"GPU-dra-a-1": 2048}


def test_a_relist_of_claims_and_slices_equals_the_events(cache):
    claims = [share_claim("a", "gpu-0", 1024, "pod-a"), share_claim("b", "gpu-1", 2048)]
    for body in claims:
        cache.apply_claim(ADDED, body)
    by_events = cache.assignments_on("dra-a")
    relisted = ClusterCache()
    relisted.replace_all_claims([*claims, claim("gone", [whole_request()])])
    relisted.replace_all_nodes([node_json("dra-a")])
    relisted.replace_all_slices([resource_slice("dra-a", [gpu(0), gpu(1)])])
    relisted.replace_all_claims(claims)
    assert relisted.assignments_on("dra-a") == by_events
    version = relisted.version
    relisted.replace_all_claims(claims)
    relisted.replace_all_slices([resource_slice("dra-a", [gpu(0), gpu(1)])])
    assert relisted.node_version("dra-a") <= version  # nothing moved, no node's version did
    relisted.replace_all_slices([])
    assert relisted.node("dra-a").inventory is None and relisted.assignments_on("dra-a") == []


def test_a_new_slice_generation_recharges_the_claims_on_it(cache):
    cache.apply_claim(ADDED, share_claim("a", "gpu-1", 1024, "pod-a"))
    cache.apply_slice(MODIFIED, resource_slice("dra-a", [gpu(0)], generation=2))
    assert cache.assignments_on("dra-a") == []  # gpu-1 is gone: its claim holds nothing seen
    assert cache.size()["resourceslices"] == 1 and cache.size()["resourceclaims"] == 1


def test_a_claim_cache_lookup_finds_it_by_namespace_and_name(cache):
    cache.apply_claim(ADDED, claim("a", [whole_request()], namespace="team"))
    assert cache.claim("team", "a").uid == "claim-a" and cache.claim("default", "a") is None


# Relist equals incremental, and versions move exactly with a node's view, over histories of
# nodes, slices, claims and claim pods.

DRA_NODES = ("dra-a", "node-a")
SLICE_VARIANTS = [
    resource_slice("dra-a", [gpu(0), gpu(1)]),
    resource_slice("dra-a", [gpu(0)], generation=2),
    resource_slice("dra-a", [gpu(0, memory_mib=1)]),
    resource_slice("dra-a", [gpu(1)], count=2, name="dra-a-second"),
    resource_slice("node-a", [gpu(0, "node-a")]),
]
CLAIM_VARIANTS = [
    share_claim("a", "gpu-0", 1024, "pod-a"),
    share_claim("a", "gpu-1", 2048),
    claim("a", [share_request()]),
    claim("w", [whole_request()], [result("gpu-1")], ("pod-w",)),
    claim("w", [whole_request()], [result("gpu-0", "node-a")], ("pod-w",)),
    share_claim("s", "gpu-0", 4096, "pod-a", "pod-w"),
]
POD_VARIANTS = [
    claim_pod("pod-a", {"gpu": "a"}, node="dra-a"),
    claim_pod("pod-w", {"gpu": "w"}, priority=5),
]
HISTORY = st.lists(
    st.tuples(
        st.sampled_from(["node", "slice", "claim", "pod"]),
        st.sampled_from([ADDED, MODIFIED, DELETED]),
        st.integers(0, 5),
    ),
    max_size=30,
)


def dra_event(kind: str, at: int) -> dict:
    variants = {
        "node": [node_json("dra-a"), gpu_node("node-a"), node_json("node-a")],
        "slice": SLICE_VARIANTS,
        "claim": CLAIM_VARIANTS,
        "pod": POD_VARIANTS,
    }[kind]
    return variants[at % len(variants)]


def dra_apply(cache: ClusterCache, kind: str, event_type: str, obj: dict) -> None:
    apply = {"node": cache.apply_node, "slice": cache.apply_slice, "claim": cache.apply_claim,
             "pod": cache.apply_pod}[kind]  # fmt: skip
    apply(event_type, obj)


def identity(kind: str, obj: dict) -> str:
    return obj["metadata"]["uid" if kind in ("claim", "pod") else "name"]


def dra_view(cache: ClusterCache, node: str) -> tuple:
    """What a node's placement state is built from: its record and who holds what there
    (the holders' pod records are read when preemption plans, never cached)."""
    holders = [(uid, held) for uid, _, held in cache.holders_on(node)]
    return cache.node(node), cache.assignments_on(node), holders


@settings(max_examples=200, deadline=None)
@given(history=HISTORY)
def test_a_relist_of_every_kind_equals_the_events_it_replaces(history):
    incremental = ClusterCache()
    latest: dict[tuple[str, str], dict] = {}
    for kind, event_type, at in history:
        obj = dra_event(kind, at)
        dra_apply(incremental, kind, event_type, obj)
        if event_type == DELETED:
            latest.pop((kind, identity(kind, obj)), None)
        else:
            latest[(kind, identity(kind, obj))] = obj
    relisted = ClusterCache()
    of = {k: [o for (kind, _), o in latest.items() if kind == k] for k in ("node", "slice")}
    relisted.replace_all_claims([o for (kind, _), o in latest.items() if kind == "claim"])
    relisted.replace_all_slices(of["slice"])
    relisted.replace_all_pods([o for (kind, _), o in latest.items() if kind == "pod"])
    relisted.replace_all_nodes(of["node"])
    for node in DRA_NODES:
        assert dra_view(relisted, node) == dra_view(incremental, node)
    assert relisted.dra_nodes() == incremental.dra_nodes()
    assert relisted.gpu_totals() == incremental.gpu_totals()


@settings(max_examples=200, deadline=None)
@given(history=HISTORY)
def test_a_node_version_moves_exactly_when_its_slices_or_claims_change_its_view(history):
    cache = ClusterCache()
    for kind, event_type, at in history:
        before = {n: (dra_view(cache, n), cache.node_version(n)) for n in DRA_NODES}
        dra_apply(cache, kind, event_type, dra_event(kind, at))
        for name, (view, version) in before.items():
            moved = cache.node_version(name) != version
            assert (dra_view(cache, name) != view) == moved, name
