"""The local cluster behaves like a Kubernetes cluster with GPU nodes."""

from __future__ import annotations

import subprocess
import uuid

import pytest
from kubernetes import client

from e2e.cluster.fake_nodes import KWOK_NODE_SELECTOR, KWOK_TOLERATION
from e2e.cluster.local_cluster import DEFAULT_FLEET, LocalCluster
from e2e.cluster.processes import is_ours, wait_until
from images import cluster_binaries
from infergrid import constants
from infergrid.fleet import load_fleet
from infergrid.inventory import node_capacity
from infergrid.quantity import parse_whole_quantity

pytestmark = pytest.mark.e2e


def gpu_capacity(node: client.V1Node) -> int:
    """Whole GPUs the node reports; the API server may write 1000 as 1k."""
    where = f"node {node.metadata.name} status.capacity[{constants.RESOURCE_GPU}]"
    return parse_whole_quantity((node.status.capacity or {}).get(constants.RESOURCE_GPU, 0), where)


def gpu_pod(name: str, gpus: int, scheduler: str | None = None) -> dict:
    resources = {"limits": {constants.RESOURCE_GPU: str(gpus)}} if gpus else {}
    spec = {
        "tolerations": [KWOK_TOLERATION],
        "nodeSelector": KWOK_NODE_SELECTOR,
        "containers": [{"name": "main", "image": "infergrid/engine", "resources": resources}],
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def wait_running(core: client.CoreV1Api, name: str, ns: str) -> client.V1Pod:
    wait_until(
        lambda: core.read_namespaced_pod(name, ns).status.phase == "Running",
        120,
        f"pod {ns}/{name} to be Running",
    )
    return core.read_namespaced_pod(name, ns)


def test_pod_asking_for_one_gpu_runs_on_a_gpu_node(cluster, namespace):
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_pod(namespace, gpu_pod("one-gpu", 1))
    pod = wait_running(core, "one-gpu", namespace)
    node = core.read_node(pod.spec.node_name)
    assert gpu_capacity(node) >= 1


def test_pod_asking_for_more_gpus_than_any_node_stays_pending(cluster, namespace):
    core = client.CoreV1Api(cluster.api)
    most = max(gpu_capacity(n) for n in core.list_node().items)
    core.create_namespaced_pod(namespace, gpu_pod("too-many", most + 1))

    def failed_scheduling() -> bool:
        events = core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=too-many"
        ).items
        return any(e.reason == "FailedScheduling" for e in events)

    wait_until(failed_scheduling, 120, "a FailedScheduling event for too-many")
    pod = core.read_namespaced_pod("too-many", namespace)
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None


def test_infergrid_scheduler_places_pods_that_ask_for_no_gpu(cluster, namespace):
    """The second scheduler runs; a pod it manages without GPU resources needs no extender."""
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_pod(namespace, gpu_pod("cpu-only", 0, constants.SCHEDULER_NAME))
    pod = wait_running(core, "cpu-only", namespace)
    assert pod.spec.node_name


def test_fleet_nodes_carry_their_gpu_capacity(cluster):
    if not cluster.local:
        pytest.skip("the sample fleet exists only on the local cluster")
    core = client.CoreV1Api(cluster.api)
    for node in load_fleet(DEFAULT_FLEET).nodes:
        capacity = core.read_node(node.name).status.capacity
        for resource, value in node_capacity(node.inventory).items():
            stored = parse_whole_quantity(capacity[resource], f"{node.name} {resource}")
            assert stored == int(value), (node.name, resource, capacity[resource])


def test_kubectl_lists_gpu_nodes_wide(cluster):
    kubectl = cluster_binaries.paths()["kubectl"] if cluster.local else "kubectl"
    core = client.CoreV1Api(cluster.api)
    gpu_nodes = [n.metadata.name for n in core.list_node().items if gpu_capacity(n)]
    out = subprocess.run(
        [str(kubectl), f"--kubeconfig={cluster.kubeconfig}", "get", "nodes", "-o", "wide"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert gpu_nodes
    for name in gpu_nodes:
        assert any(line.split()[0] == name and " Ready " in line for line in out.splitlines())


def test_down_stops_every_process(tmp_path, cluster):
    """A second, one-node cluster started and stopped beside the session's one."""
    if not cluster.local:
        pytest.skip("starts a local cluster")
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        "version: v1\nnodes:\n- name: solo-"
        + uuid.uuid4().hex[:6]
        + "\n  gpus: {model: NVIDIA L4, count: 1, memoryMiB: 23034, smCount: 58,"
        " computeCapability: '8.9'}\n"
    )
    local = LocalCluster(tmp_path / "state")
    local.up(fleet_file)
    started = local.processes.records()
    assert set(started) >= {"etcd", "kube-apiserver", "kwok", "infergrid-scheduler"}
    assert all(is_ours(pid, binary) for pid, binary in started.values())
    local.down()
    assert [name for name, (pid, binary) in started.items() if is_ours(pid, binary)] == []
    assert not local.is_running()
