"""Issue 37, point 9, and the container toolkit's node condition, attacked with real tokens.

A pod created with `spec.nodeName` skips the extender, so it reaches its node with no GPU
assignment, beside pods that hold one; the kubelet's Allocate names devices, not pods. The
chart's direct-node policy refuses such a pod from a tenant's token, and where no policy
covers the namespace, the device plugin learns from the kubelet's PodResources which pod it
is admitting, so the intruder is refused and the victim keeps its GPU. The device plugin's
own token may write its node's InferGridContainerToolkitSafe condition, and nothing else of
any node's status.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from device_plugin.kube import STRATEGIC_MERGE, node_condition_patch, set_node_condition
from device_plugin.toolkit import CONDITION_TOOLKIT_SAFE, NodeCondition
from e2e.cluster.local_cluster import DEFAULT_FLEET, LocalCluster
from e2e.cluster.processes import wait_until
from e2e.cluster.real_node import capacity_advertised
from e2e.helm_release import forbidden, gpu_nodes, tenant_api
from e2e.real_pods import shell_pod
from infergrid import constants
from infergrid.assignment_annotation import (
    AssignedGpu,
    ContainerAssignment,
    PodAssignment,
    encode_assignment,
)
from infergrid.fleet import FleetNode, load_fleet

pytestmark = pytest.mark.e2e

TENANT = "tenant"
TENANT_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "delete"]}
]
SHARE = {constants.RESOURCE_VGPU: "1", constants.RESOURCE_GPU_MEMORY: "1024"}


@pytest.fixture()
def tenant(cluster, namespace) -> client.CoreV1Api:
    """A tenant's API in a namespace the suite release polices: it may create pods there."""
    api = client.CoreV1Api(tenant_api(cluster, namespace, TENANT_RULES, TENANT))
    wait_until(lambda: in_force(cluster, namespace), 30,
               "the API server to load the release's direct-node policy")  # fmt: skip
    return api


def in_force(cluster, namespace: str) -> bool:
    """Whether the direct-node policy refuses a dry run: the API server loads a new policy
    a moment after it is created."""
    body = bound_pod("probe", min(gpu_nodes(cluster)), {constants.RESOURCE_GPU: "1"})
    try:
        client.CoreV1Api(cluster.api).create_namespaced_pod(namespace, body, dry_run="All")
    except ApiException as err:
        return err.status == 403
    return False


def bound_pod(name: str, node: str | None, limits: dict[str, str], init: bool = False) -> dict:
    """A pod no scheduler places; with `node`, bound to it at creation."""
    container = {"name": "main", "image": "infergrid/pause", "resources": {"limits": limits}}
    spec: dict = {"schedulerName": "nobody", "containers": [container]}
    if init:
        spec["initContainers"] = [{**container, "name": "warm"}]
        container["resources"] = {}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


def pod_names(core: client.CoreV1Api, namespace: str) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(namespace).items}


# --- the direct-node policy -------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "init", "named"),
    [
        ({constants.RESOURCE_GPU: "1"}, False, "main"),
        (SHARE, False, "main"),
        ({constants.mig_resource("3g.40gb"): "1"}, False, "main"),
        ({constants.RESOURCE_GPU: "1"}, True, "warm"),
    ],
    ids=["whole GPU", "share", "MIG", "init container"],
)
def test_a_tenant_cannot_create_a_gpu_pod_bound_to_a_node(
    cluster, namespace, tenant, limits, init, named
):
    node = min(gpu_nodes(cluster))
    body = bound_pod("intruder", node, limits, init)
    message = forbidden(lambda: tenant.create_namespaced_pod(namespace, body))
    assert message.startswith('pods "intruder" is forbidden: ValidatingAdmissionPolicy')
    assert f"spec.nodeName: a pod whose containers ({named}) ask for InferGrid GPU resources" in (
        message
    )
    assert f"may not be bound to node {node} at creation" in message
    assert pod_names(tenant, namespace) == set()


@pytest.mark.parametrize(
    ("node", "limits"),
    [("nowhere", {"cpu": "10m"}), (None, {constants.RESOURCE_GPU: "1"})],
    ids=["bound, no GPU", "GPU, left to a scheduler"],
)
def test_the_policy_leaves_other_pods_alone(cluster, namespace, tenant, node, limits):
    tenant.create_namespaced_pod(namespace, bound_pod("fine", node, limits))
    assert pod_names(tenant, namespace) == {"fine"}


# --- the toolkit condition: the device plugin's token on nodes/status -------------------


UNSAFE = NodeCondition(CONDITION_TOOLKIT_SAFE, "False", "EnvvarAcceptedWhenUnprivileged", "e2e")


def conditions(core: client.CoreV1Api, node: str) -> dict[str, client.V1NodeCondition]:
    return {c.type: c for c in core.read_node_status(node).status.conditions or []}


@pytest.fixture()
def plugin_core(cluster, identities, tmp_path) -> Iterator[tuple[client.CoreV1Api, str, str]]:
    """The device plugin's API as its DaemonSet pod on a KWOK GPU node holds it, that node,
    and another GPU node; the node's condition is put back as it was at the end (the
    cluster's own plugin process for that node wrote it)."""
    mine, other = sorted(gpu_nodes(cluster))[:2]
    admin = client.CoreV1Api(cluster.api)
    before = conditions(admin, mine).get(CONDITION_TOOLKIT_SAFE)
    path = identities.plugin_kubeconfig(mine, tmp_path / "kubeconfig")
    core = client.CoreV1Api(config.new_client_from_config(str(path)))
    wait_until(lambda: refused_on(core, other), 30,
               "the API server to load the release's node-status policy")  # fmt: skip
    yield core, mine, other
    put_back = (
        {"type": CONDITION_TOOLKIT_SAFE, "$patch": "delete"}
        if before is None
        else cluster.api.sanitize_for_serialization(before)
    )
    admin.patch_node_status(
        mine, {"status": {"conditions": [put_back]}}, _content_type=STRATEGIC_MERGE
    )


def refused_on(core: client.CoreV1Api, node: str) -> bool:
    """Whether a dry run of the condition's patch on `node` is refused."""
    patch = node_condition_patch(UNSAFE, datetime.now(UTC))
    try:
        core.patch_node_status(node, patch, dry_run="All", _content_type=STRATEGIC_MERGE)
    except ApiException as err:
        return err.status == 403
    return False


def test_the_plugin_writes_its_nodes_toolkit_condition(cluster, plugin_core):
    core, mine, _ = plugin_core
    assert set_node_condition(core, mine, UNSAFE, datetime.now(UTC))
    written = conditions(client.CoreV1Api(cluster.api), mine)[CONDITION_TOOLKIT_SAFE]
    assert (written.status, written.reason, written.message) == ("False", UNSAFE.reason, "e2e")
    assert "Ready" in conditions(client.CoreV1Api(cluster.api), mine)


def test_the_plugin_cannot_write_another_nodes_status(cluster, plugin_core):
    core, mine, other = plugin_core
    patch = node_condition_patch(UNSAFE, datetime.now(UTC))
    message = forbidden(lambda: core.patch_node_status(other, patch, _content_type=STRATEGIC_MERGE))
    assert f"may only change the status of its own node: node {other}" in message
    assert f"the caller runs on, {mine}" in message
    written = conditions(client.CoreV1Api(cluster.api), other).get(CONDITION_TOOLKIT_SAFE)
    assert written is None or written.message != UNSAFE.message


@pytest.mark.parametrize(
    "patch",
    [
        {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Forged",
                                    "message": "e2e"}]}},
        {"status": {"capacity": {constants.RESOURCE_GPU: "1000"}}},
    ],
    ids=["Ready", "capacity"],
)  # fmt: skip
def test_the_plugin_cannot_change_the_rest_of_its_nodes_status(cluster, plugin_core, patch):
    core, mine, _ = plugin_core
    admin = client.CoreV1Api(cluster.api)
    before = admin.read_node_status(mine).status.capacity
    message = forbidden(lambda: core.patch_node_status(mine, patch, _content_type=STRATEGIC_MERGE))
    assert message.endswith(
        "the InferGrid device plugin may only change the InferGridContainerToolkitSafe "
        "condition of its node"
    )
    assert conditions(admin, mine)["Ready"].reason != "Forged"
    assert admin.read_node_status(mine).status.capacity == before


# --- the race on the real node, where no policy covers the namespace --------------------


@pytest.fixture(scope="module")
def real(cluster) -> Iterator[FleetNode]:
    """The real node, its device plugin process started again so it runs this tree's code."""
    if not cluster.local:
        pytest.skip("stops and starts the local cluster's own kubelet")
    node = next(n for n in load_fleet(DEFAULT_FLEET).nodes if n.real)
    with LocalCluster().host_device_plugin_stopped(node):
        pass
    yield node


@contextmanager
def kubelet_stopped(node: FleetNode) -> Iterator[None]:
    """The real node's kubelet stopped while pods are made, so that it admits them together,
    in one batch, oldest first, when it starts again."""
    local = LocalCluster()
    name = f"kubelet-{node.name}"
    argv = local.processes.argv(name)
    local.processes.stop(name)
    try:
        yield
    finally:
        local.processes.start(name, argv)
        core = client.CoreV1Api(local.api())
        wait_until(lambda: capacity_advertised(core, node), 90, "the GPUs advertised again")


def victim_pod(name: str, node: str, gpu: str) -> dict:
    """A share of `gpu` bound to `node` with its assignment written where no policy runs,
    as the extender would have placed it."""
    share = ContainerAssignment("main", (AssignedGpu(gpu, 1024, 0),), shared=True)
    pod = shell_pod(name, "sleep 3600", SHARE)
    pod["spec"].update(nodeName=node, schedulerName=constants.SCHEDULER_NAME)
    text = encode_assignment(PodAssignment(node, datetime.now(UTC), (share,)))
    pod["metadata"]["annotations"] = {constants.ANNOTATION_GPU_ASSIGNMENT: text}
    return pod


def settled(core: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod | None:
    pod = core.read_namespaced_pod(name, namespace)
    return pod if pod.status.phase in ("Running", "Failed", "Succeeded") else None


@pytest.mark.parametrize("intruder_first", [True, False], ids=["intruder older", "victim older"])
def test_the_plugin_never_gives_an_intruder_the_gpu_assigned_to_another_pod(
    cluster, namespaces, real, intruder_first
):
    """Both pods wait for the kubelet, which admits them one at a time, the older first,
    listing each in its PodResources as it admits it. Whichever comes first, the intruder
    fails admission with the plugin's reason and the victim runs on the share it was
    assigned: before the fix, an intruder admitted first was granted the victim's share."""
    core = client.CoreV1Api(cluster.api)
    ns = namespaces()
    gpu = next(g for g in real.inventory.gpus if not g.mig_instances).uuid
    tag = uuid.uuid4().hex[:4]
    intruder = shell_pod(f"intruder-{tag}", "sleep 3600", SHARE)
    intruder["spec"]["nodeName"] = real.name
    victim = victim_pod(f"victim-{tag}", real.name, gpu)
    with kubelet_stopped(real):
        for body in (intruder, victim) if intruder_first else (victim, intruder):
            core.create_namespaced_pod(ns, body)
    wait_until(lambda: settled(core, ns, f"intruder-{tag}"), 120, "the intruder admitted or not")
    wait_until(lambda: settled(core, ns, f"victim-{tag}"), 120, "the victim admitted or not")
    lost = core.read_namespaced_pod(f"intruder-{tag}", ns).status
    assert (lost.phase, lost.reason) == ("Failed", "UnexpectedAdmissionError"), lost
    assert (
        f"is asked for by {ns}/intruder-{tag}/main, which the kubelet is admitting with no GPU "
        "assignment"
        in lost.message
        or f"no unallocated share assignment on node {real.name}" in lost.message
    ), lost.message
    kept = core.read_namespaced_pod(f"victim-{tag}", ns).status
    assert kept.phase == "Running", kept
