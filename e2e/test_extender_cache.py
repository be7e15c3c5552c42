"""The extender's watch cache and Lease election against a real API server."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from kubernetes import client

from e2e.cluster.processes import wait_until
from infergrid import constants
from infergrid.assignment_annotation import (
    AssignedGpu,
    ContainerAssignment,
    PodAssignment,
    encode_assignment,
)
from scheduler_extender.leader import LeaseElector
from scheduler_extender.watch_cache import ClusterCache

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.unpoliced(
        "the cache is fed assignments written directly, as the extender would write them"
    ),
]


@pytest.fixture()
def cache(identities) -> Iterator[ClusterCache]:
    """The extender's cache, reading as the chart's extender ServiceAccount."""
    stop = threading.Event()
    cache = ClusterCache(watch_timeout_s=2)
    cache.start(identities.api("extender"), stop)
    try:
        assert cache.wait_synced(30)
        yield cache
    finally:
        stop.set()


def assignment(node: str) -> PodAssignment:
    share = AssignedGpu(f"GPU-{node}", 1024, 10)
    container = ContainerAssignment("main", (share,), shared=True)
    return PodAssignment(node, datetime.now(UTC).replace(microsecond=0), (container,))


def pod_manifest(name: str, annotations: dict[str, str]) -> dict:
    """A pod no scheduler picks up, so it stays Pending and deletes at once."""
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "schedulerName": "e2e-nobody",
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


def test_the_cache_sees_every_node(cluster, cache):
    names = {n.metadata.name for n in client.CoreV1Api(cluster.api).list_node().items}
    assert names and names <= set(cache.nodes())
    assert cache.size()["nodes"] >= len(names)


def test_an_assigned_pod_counts_on_its_node_until_deleted(cluster, namespace, cache):
    core = client.CoreV1Api(cluster.api)
    node = f"cache-e2e-{uuid.uuid4().hex[:6]}"  # a name no other test places on
    held = assignment(node)
    annotations = {constants.ANNOTATION_GPU_ASSIGNMENT: encode_assignment(held)}
    pod = core.create_namespaced_pod(namespace, pod_manifest("assigned", annotations))
    wait_until(lambda: cache.assignments_on(node) == [held], 10, "the assignment in the cache")
    assert cache.pod(pod.metadata.uid).scheduler_name == "e2e-nobody"
    before = cache.node_version(node)
    core.delete_namespaced_pod("assigned", namespace, grace_period_seconds=0)
    wait_until(lambda: cache.assignments_on(node) == [], 10, "the assignment to leave the cache")
    assert cache.pod(pod.metadata.uid) is None and cache.node_version(node) != before


def test_a_reservation_gives_way_to_the_written_assignment(cluster, namespace, cache):
    core = client.CoreV1Api(cluster.api)
    node = f"cache-e2e-{uuid.uuid4().hex[:6]}"
    held = assignment(node)
    pod = core.create_namespaced_pod(namespace, pod_manifest("reserved", {}))
    uid = pod.metadata.uid
    wait_until(lambda: cache.pod(uid) is not None, 10, "the pod in the cache")
    cache.reserve(uid, namespace, "reserved", held)
    assert cache.assignments_on(node) == [held]
    patch = {
        "metadata": {"annotations": {constants.ANNOTATION_GPU_ASSIGNMENT: encode_assignment(held)}}
    }
    core.patch_namespaced_pod("reserved", namespace, patch)
    wait_until(lambda: cache.size()["reservations"] == 0, 10, "the reservation to be superseded")
    assert cache.assignments_on(node) == [held]
    assert cache.pod(uid).assignment == held


def test_one_of_two_electors_leads_and_the_other_takes_over_on_release(cluster, identities):
    """Two replicas of the extender, each as its ServiceAccount, on the one Lease its RBAC
    names in the release's namespace."""
    namespace, lease_name = identities.release.namespace, identities.release.sa("extender")
    electors = [
        LeaseElector(identities.api("extender"), namespace, lease_name, name, 5, 0.2)
        for name in ("a", "b")
    ]
    stops = {e.identity: threading.Event() for e in electors}
    threads = [
        threading.Thread(target=e.run, args=(stops[e.identity],), daemon=True) for e in electors
    ]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: any(e.is_leader() for e in electors), 10, "a leader")
        leader, follower = sorted(electors, key=lambda e: not e.is_leader())
        assert not follower.is_leader()
        leases = client.CoordinationV1Api(cluster.api)
        transitions = leases.read_namespaced_lease(lease_name, namespace).spec.lease_transitions
        transitions = transitions or 0  # the suite's extender processes held it before
        stops[leader.identity].set()  # run() releases the Lease on its way out
        wait_until(follower.is_leader, 10, f"{follower.identity} to take over")
        assert not leader.is_leader()
        lease = leases.read_namespaced_lease(lease_name, namespace)
        assert lease.spec.holder_identity == follower.identity
        assert lease.spec.lease_transitions == transitions + 1
    finally:
        for stop in stops.values():
            stop.set()
        for thread in threads:
            thread.join(10)
