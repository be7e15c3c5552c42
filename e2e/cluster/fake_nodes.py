"""The fleet's GPU nodes as KWOK-managed Node objects.

A node's capacity carries the extended resources that the device plugin
would advertise (`nvidia.com/gpu`, `infergrid.io/vgpu`, MIG devices), computed
from the same fleet file that feeds the device plugin's fake NVML.
"""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.rest import ApiException

from infergrid.constants import ANNOTATION_GPU_INVENTORY, ANNOTATION_GPU_USAGE
from infergrid.fleet import Fleet, FleetNode
from infergrid.inventory import node_capacity, node_labels

from .processes import ProcessTable, wait_until

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# KWOK nodes never start a container: the taint keeps every pod off them but those that say
# they only need a placement (benchmarks, placement tests, the demo's fleet table).
KWOK_TAINT = {"key": KWOK_ANNOTATION, "value": "fake", "effect": "NoSchedule"}
KWOK_TOLERATION = {**KWOK_TAINT, "operator": "Equal"}
# The label every KWOK node carries: what keeps a pod that tolerates the taint off real nodes.
KWOK_NODE_SELECTOR = {"type": "kwok"}


def node_manifest(node: FleetNode) -> dict:
    capacity = {
        "cpu": node.cpu,
        "memory": node.memory,
        "pods": "110",
        **node_capacity(node.inventory),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "annotations": {KWOK_ANNOTATION: "fake"},
            "labels": {
                "kubernetes.io/hostname": node.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **KWOK_NODE_SELECTOR,
                **node_labels(node.inventory),
            },
        },
        "spec": {"taints": [KWOK_TAINT]},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def create(api: client.ApiClient, fleet: Fleet) -> None:
    """Creates every KWOK node of the fleet (a real node registers itself through its kubelet);
    one that already exists is left as it is."""
    core = client.CoreV1Api(api)
    for node in fleet.nodes:
        if node.real:
            continue
        try:
            core.create_node(node_manifest(node))
        except ApiException as err:
            if err.status != 409:
                raise


def wait_published(
    api: client.ApiClient, fleet: Fleet, processes: ProcessTable, timeout: float = 60
) -> None:
    """Waits until every node carries the inventory and usage its device plugin publishes."""
    core = client.CoreV1Api(api)
    wanted = {ANNOTATION_GPU_INVENTORY, ANNOTATION_GPU_USAGE}

    def published() -> bool:
        for node in fleet.nodes:
            processes.check_alive(f"device-plugin-{node.name}")
            if not wanted <= set(core.read_node(node.name).metadata.annotations or {}):
                return False
        return True

    wait_until(published, timeout, "device plugins to publish every node's GPUs")


def _schedulable(node: client.V1Node) -> bool:
    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
    not_ready_taint = any(t.key == "node.kubernetes.io/not-ready" for t in node.spec.taints or [])
    return ready and not not_ready_taint


def wait_schedulable(api: client.ApiClient, processes: ProcessTable, timeout: float = 90) -> None:
    """Waits until KWOK reports every fake node Ready and its not-ready taint is gone."""
    core = client.CoreV1Api(api)

    def all_ready() -> bool:
        nodes = core.list_node(label_selector="type=kwok").items
        return bool(nodes) and all(_schedulable(n) for n in nodes)

    wait_until(
        all_ready,
        timeout,
        "the fake GPU nodes to be Ready and untainted",
        lambda: processes.check_alive("kwok"),
    )
