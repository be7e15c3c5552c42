"""DRA mode on the real node, as a user installs it: the chart with the real node's pool in
`mode: dra`, on containerd 2 with CDI and the cluster's DRA gates on.

The node is moved from the device plugin as the README says: the cluster's own plugin
process stops, its annotations come off the node, and the chart's DRA driver DaemonSet then
publishes the node's fake GPUs as ResourceSlices and registers with the real kubelet. An
InferenceService that asks for a 4 GiB share by claim gets a ResourceClaimTemplate from the
operator; the chart's kube-scheduler (sent to its extender by the claim marker) allocates the
claim; the kubelet asks the driver to prepare it, containerd applies the CDI spec the driver
wrote, and the engine serves within the share. Deleting the service unprepares the claim.
Meanwhile the KWOK nodes stay in device-plugin mode, so one extender keeps the books of both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from e2e.cluster.local_cluster import DEFAULT_FLEET, LocalCluster
from e2e.cluster.node_configs import CDI_DIR
from e2e.cluster.node_images import image_ref
from e2e.cluster.processes import wait_until
from e2e.extender_support import share_pod
from e2e.helm_release import (
    CHART_CLASSES,
    CHART_SCHEDULER,
    Release,
    component_pods,
    give_tier,
    helm,
    install_on_real_node,
    ok,
)
from e2e.helm_release import kubectl as kubectl_admin
from e2e.operator_support import (
    container_statuses,
    create_service,
    delete_service,
    kubectl,
)
from e2e.test_mps import complete, pod_env, serving_pod
from infergrid import dra
from infergrid.assignment_annotation import decode_assignment
from infergrid.constants import (
    ANNOTATION_GPU_ASSIGNMENT,
    ANNOTATION_GPU_INVENTORY,
    ANNOTATION_GPU_USAGE,
    LABEL_INFERENCESERVICE,
)
from infergrid.fleet import FleetNode, load_fleet
from infergrid.quantity import parse_whole_quantity

pytestmark = pytest.mark.e2e

SAMPLE = Path(__file__).resolve().parents[1] / "deploy/samples/dra/smollm2-claim.yaml"


def node_slices(cluster, node: str) -> list[dict]:
    """The node's ResourceSlices of InferGrid's driver, as `kubectl get resourceslices` lists
    them to a cluster admin."""
    listed = json.loads(ok(kubectl_admin(cluster, "get", "resourceslices", "-o", "json")))
    return [
        s
        for s in listed["items"]
        if s["spec"].get("nodeName") == node and s["spec"]["driver"] == dra.DRIVER
    ]


def withdraw_device_plugin(cluster, node: str) -> None:
    """The README's step for a node leaving the device plugin: its annotations come off."""
    ok(kubectl_admin(cluster, "annotate", "node", node,
                     f"{ANNOTATION_GPU_INVENTORY}-", f"{ANNOTATION_GPU_USAGE}-"))  # fmt: skip


@pytest.fixture(scope="module")
def dra_node(
    cluster, helm_ready, namespaces, infsvc_crd, priority_classes
) -> Iterator[tuple[Release, FleetNode]]:
    """The chart with the real node's pool in DRA mode; the cluster's own device plugin
    process stopped meanwhile, and the node handed back to it after, with no slice left."""
    if not cluster.local:
        pytest.skip("installs the images built here on the local cluster's real node")
    real = next(n for n in load_fleet(DEFAULT_FLEET).nodes if n.real)
    pools = [{"name": "dra", "nodeSelector": {"infergrid.io/real-node": "true"}, "mode": "dra"}]
    with LocalCluster().host_device_plugin_stopped(real):
        withdraw_device_plugin(cluster, real.name)
        rel = install_on_real_node(
            cluster, namespaces, "--set-json", f"nodePools={json.dumps(pools)}",
            "--set", "gateway.enabled=false",
        )  # fmt: skip
        give_tier(cluster.api, rel.served)
        try:
            yield rel, real
        finally:
            helm(cluster, "uninstall", rel.name, "--namespace", rel.namespace, "--wait")
            wait_until(lambda: not component_pods(cluster, rel, "dra-driver"), 120,
                       "the DRA driver pod gone")  # fmt: skip
            # The driver leaves its slices for a restart; a node going back to the device
            # plugin must not offer its GPUs both ways.
            for piece in node_slices(cluster, real.name):
                kubectl_admin(cluster, "delete", "resourceslice", piece["metadata"]["name"])
            wait_until(lambda: not node_slices(cluster, real.name), 60, "the slices gone")


def driver_alive(cluster, rel: Release) -> None:
    """Fails at once, with its log, when the driver's container has exited."""
    core = client.CoreV1Api(cluster.api)
    for pod in component_pods(cluster, rel, "dra-driver"):
        for status in container_statuses(pod):
            if status.restart_count or (status.state and status.state.terminated):
                log = core.read_namespaced_pod_log(
                    pod.metadata.name,
                    rel.namespace,
                    container=status.name,
                    previous=bool(status.restart_count),
                    tail_lines=30,
                )
                ended = status.last_state.terminated or status.state.terminated
                raise AssertionError(f"the DRA driver exited: {ended}\n{log}")


def devices(slices: list[dict]) -> dict[str, dict]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def attribute(device: dict, name: str) -> object:
    (value,) = device["attributes"][name].values()
    return value


def test_kubectl_lists_the_fake_gpus_as_resourceslices_with_their_attributes(cluster, dra_node):
    rel, real = dra_node
    wait_until(lambda: devices(node_slices(cluster, real.name)), 120,
               "the driver's slices", lambda: driver_alive(cluster, rel))  # fmt: skip
    listed = ok(kubectl_admin(cluster, "get", "resourceslices"))
    assert real.name in listed and dra.DRIVER in listed, listed
    found = devices(node_slices(cluster, real.name))
    whole = [g for g in real.inventory.gpus if not g.mig_instances]
    (mig_gpu,) = [g for g in real.inventory.gpus if g.mig_instances]
    assert set(found) == {dra.gpu_device(g.index) for g in whole} | {
        dra.mig_device(mig_gpu.index, n) for n in range(len(mig_gpu.mig_instances))
    }
    for gpu in whole:
        device = found[dra.gpu_device(gpu.index)]
        assert attribute(device, dra.ATTR_TYPE) == dra.TYPE_GPU
        assert attribute(device, dra.ATTR_UUID) == gpu.uuid
        assert attribute(device, dra.ATTR_MODEL) == gpu.model
        assert attribute(device, dra.ATTR_SM_COUNT) == gpu.sm_count
        assert attribute(device, dra.ATTR_COMPUTE_CAPABILITY) == f"{gpu.compute_capability}.0"
        memory = device["capacity"][dra.CAP_MEMORY]["value"]  # canonical: 81920Mi reads 80Gi
        assert parse_whole_quantity(memory, "memory") == gpu.memory_mib << 20
        # The cluster's DRAConsumableCapacity gate is on: shares are carved from the GPU.
        assert device["allowMultipleAllocations"] is True
    for n, instance in enumerate(mig_gpu.mig_instances):
        device = found[dra.mig_device(mig_gpu.index, n)]
        assert attribute(device, dra.ATTR_MIG_PROFILE) == instance.profile
        assert attribute(device, dra.ATTR_PARENT_UUID) == mig_gpu.uuid
        # DRAPartitionableDevices is on: the instances draw on their GPU's counters.
        (consumed,) = device["consumesCounters"]
        assert consumed["counterSet"] == dra.counter_set(mig_gpu.index)
    claims = kubectl(cluster.kubeconfig, "get", "deviceclasses", "-o", "name")
    assert {f"deviceclass.resource.k8s.io/{c}" for c in
            (dra.CLASS_GPU, dra.CLASS_SHARE, dra.CLASS_MIG)} <= set(claims.split())  # fmt: skip


def claim_service(name: str) -> dict:
    """The DRA sample, one replica, under `name`."""
    body = yaml.safe_load(SAMPLE.read_text())
    body["metadata"]["name"] = body["spec"]["model"]["name"] = name
    body["spec"]["autoscaling"] = {"enabled": False}
    body["spec"]["replicas"] = 1
    return body


def pod_claim(cluster, namespace: str, pod: client.V1Pod) -> dict:
    (status,) = pod.status.resource_claim_statuses
    return (
        client.ResourceV1Api(cluster.api)
        .read_namespaced_resource_claim(status.resource_claim_name, namespace)
        .to_dict()
    )


def test_a_service_claiming_a_share_is_allocated_prepared_served_and_unprepared(cluster, dra_node):
    rel, real = dra_node
    namespace, core = rel.served, client.CoreV1Api(cluster.api)
    create_service(cluster.api, namespace, claim_service("chat-dra"))
    pod = serving_pod(core, namespace, "chat-dra")
    assert pod.spec.node_name == real.name
    claim = pod_claim(cluster, namespace, pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (dra.DRIVER, real.name)
    # The share's memory, and no SM share reserved: it asked for none (cores default to 0).
    assert result["consumed_capacity"] == {dra.CAP_MEMORY: "4Gi", dra.CAP_CORES: "0"}
    assert [r["uid"] for r in claim["status"]["reserved_for"]] == [pod.metadata.uid]
    (gpu,) = [g for g in real.inventory.gpus if dra.gpu_device(g.index) == result["device"]]

    spec_file = CDI_DIR / f"infergrid.io-gpu_{claim['metadata']['uid']}.json"
    cdi = json.loads(spec_file.read_text())
    assert cdi["kind"] == dra.CDI_VENDOR_CLASS
    env = pod_env(cluster, namespace, pod)
    assert env["INFERGRID_GPU_MEMORY_MIB"] == "4096"
    assert env["NVIDIA_VISIBLE_DEVICES"] == gpu.uuid
    assert all(s.restart_count == 0 for s in container_statuses(pod))
    assert complete(cluster, namespace, "chat-dra")["choices"][0]["text"]

    delete_service(cluster.api, namespace, "chat-dra")

    def unprepared() -> bool:
        left = core.list_namespaced_pod(
            namespace, label_selector=f"{LABEL_INFERENCESERVICE}=chat-dra"
        )
        return not left.items and not spec_file.exists()

    wait_until(unprepared, 180, "the engine pod gone and its claim unprepared")
    left = client.ResourceV1Api(cluster.api).list_namespaced_resource_claim(namespace).items
    assert claim["metadata"]["name"] not in {c.metadata.name for c in left}


def test_the_driver_pod_runs_as_the_chart_installs_it(cluster, dra_node):
    rel, real = dra_node
    (pod,) = component_pods(cluster, rel, "dra-driver")
    assert pod.spec.node_name == real.name
    assert pod.spec.service_account_name == rel.sa("dra-driver")
    assert all(s.ready for s in container_statuses(pod))
    assert not component_pods(cluster, rel, "device-plugin") or all(
        p.spec.node_name != real.name for p in component_pods(cluster, rel, "device-plugin")
    )
    registry = Path("/var/lib/kubelet/plugins_registry")
    assert (registry / f"{dra.DRIVER}-reg.sock").is_socket()


SHARE_MIB = 30 * 1024
"""Two fit on an 80 GB GPU, a third does not: on each side of the burst some pods must wait."""
KWOK_NODE = "h100"
"""The device-plugin node of the burst: two H100s of 81559 MiB, so four shares fit."""


def claim_pod(name: str, template: str, role: str | None = None) -> dict:
    """A pod whose GPU share comes by claim, through the chart's scheduler and its extender;
    of the chart's `role` PriorityClass (online, offline) where one is given."""
    classes = {"priorityClassName": CHART_CLASSES[role]["name"]} if role else {}
    return {
        "metadata": {"name": name},
        "spec": {
            **classes,
            "schedulerName": CHART_SCHEDULER,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{
                "name": "work", "image": image_ref("pause"), "imagePullPolicy": "Never",
                "resources": {"claims": [{"name": "gpu"}],
                              "limits": {dra.RESOURCE_GPU_CLAIM: "1"}},
            }],
        },
    }  # fmt: skip


def share_template(name: str, mib: int) -> dict:
    request = {"deviceClassName": dra.CLASS_SHARE,
               "capacity": {"requests": {dra.CAP_MEMORY: f"{mib}Mi"}}}  # fmt: skip
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
    }


def held_by_claims(cluster, namespace: str, node: str) -> dict[str, int]:
    """MiB each device of `node` gives to allocated claims, summed from the claims' results."""
    held: dict[str, int] = {}
    for claim in client.ResourceV1Api(cluster.api).list_namespaced_resource_claim(namespace).items:
        allocation = claim.status.allocation if claim.status else None
        for result in allocation.devices.results if allocation else []:
            assert result.pool == node, "a claim allocated off the DRA node"
            memory = (result.consumed_capacity or {})[dra.CAP_MEMORY]
            mib = parse_whole_quantity(memory, "consumedCapacity") // (1 << 20)
            held[result.device] = held.get(result.device, 0) + mib
    return held


def held_by_assignments(pods: list[client.V1Pod]) -> dict[tuple[str, str], int]:
    """MiB each GPU gives to device-plugin pods, summed from their assignments."""
    held: dict[tuple[str, str], int] = {}
    for pod in pods:
        text = (pod.metadata.annotations or {}).get(ANNOTATION_GPU_ASSIGNMENT)
        if text is None:
            continue
        assignment = decode_assignment(text)
        for container in assignment.containers:
            for gpu in container.gpus:
                key = (assignment.node, gpu.uuid)
                held[key] = held.get(key, 0) + gpu.memory_mib
    return held


@pytest.fixture()
def bare_pods(cluster, dra_node) -> Iterator[str]:
    """The served namespace for a test's own pods and templates; emptied after, until no claim
    holds a device there, so the next test finds the GPUs free."""
    rel, _ = dra_node
    namespace = rel.served
    yield namespace
    core, resource = client.CoreV1Api(cluster.api), client.ResourceV1Api(cluster.api)
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    wait_until(lambda: not core.list_namespaced_pod(namespace).items, 120, "the pods gone")
    resource.delete_collection_namespaced_resource_claim_template(namespace)
    wait_until(lambda: not resource.list_namespaced_resource_claim(namespace).items, 120,
               "the pods' claims gone")  # fmt: skip


def test_a_burst_of_claim_pods_and_device_plugin_pods_never_overcommits_a_gpu(
    cluster, dra_node, bare_pods
):
    """Six claim pods for the real node's two share GPUs and six device-plugin pods for the
    KWOK H100 node's two GPUs, made at once and interleaved, through the one extender: four of
    each are placed, two of each wait, and no GPU gives more memory than it has."""
    _, real = dra_node
    namespace, core = bare_pods, client.CoreV1Api(cluster.api)
    kubectl(cluster.kubeconfig, "apply", "-n", namespace, "-f", "-",
            stdin=json.dumps(share_template("burst-share", SHARE_MIB)))  # fmt: skip
    for i in range(6):
        core.create_namespaced_pod(namespace, claim_pod(f"claim-{i}", "burst-share"))
        plain = share_pod(f"plugin-{i}", SHARE_MIB, node=KWOK_NODE)
        plain["spec"]["schedulerName"] = CHART_SCHEDULER
        core.create_namespaced_pod(namespace, plain)

    def pods(prefix: str) -> list[client.V1Pod]:
        found = core.list_namespaced_pod(namespace).items
        return [p for p in found if p.metadata.name.startswith(prefix)]

    def bound(prefix: str) -> list[client.V1Pod]:
        return [p for p in pods(prefix) if p.spec.node_name]

    wait_until(lambda: len(bound("claim-")) == 4 and len(bound("plugin-")) == 4, 240,
               "four pods of each kind placed")  # fmt: skip

    # Settled: every waiting pod was tried and found no room.
    def refused(pod: client.V1Pod) -> bool:
        conditions = pod.status.conditions or []
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions)

    wait_until(lambda: sum(refused(p) for p in pods("")) == 4, 120, "the other four refused")
    assert len(bound("claim-")) == 4 and len(bound("plugin-")) == 4
    assert {p.spec.node_name for p in bound("claim-")} == {real.name}
    assert {p.spec.node_name for p in bound("plugin-")} == {KWOK_NODE}
    share_gpus = {dra.gpu_device(g.index): g.memory_mib for g in real.inventory.gpus
                  if not g.mig_instances}  # fmt: skip
    held = held_by_claims(cluster, namespace, real.name)
    assert set(held) <= set(share_gpus) and sum(held.values()) == 4 * SHARE_MIB
    assert all(mib <= share_gpus[device] for device, mib in held.items()), held
    h100 = next(n for n in load_fleet(DEFAULT_FLEET).nodes if n.name == KWOK_NODE)
    memory = {g.uuid: g.memory_mib for g in h100.inventory.gpus}
    assigned = held_by_assignments(pods("plugin-"))
    assert sum(assigned.values()) == 4 * SHARE_MIB
    assert all(node == KWOK_NODE and mib <= memory[uuid] for (node, uuid), mib in assigned.items())


def test_an_online_claim_pod_that_finds_the_gpus_full_evicts_one_offline_claim_holder(
    cluster, dra_node, bare_pods
):
    """kube-scheduler cannot preempt for DRA devices, and asks no extender once its DRA plugin
    refused every node; the extender's leader finds the refused pod and evicts the cheapest
    offline claim holder for it, and the pod's claim is then allocated on the freed GPU."""
    _, real = dra_node
    namespace, core = bare_pods, client.CoreV1Api(cluster.api)
    half = real.inventory.gpus[0].memory_mib // 2
    kubectl(cluster.kubeconfig, "apply", "-n", namespace, "-f", "-",
            stdin=json.dumps(share_template("half", half)))  # fmt: skip
    for i in range(4):  # both share GPUs full
        core.create_namespaced_pod(namespace, claim_pod(f"batch-{i}", "half", "offline"))

    def bound(prefix: str) -> list[str]:
        """The pods placed and not leaving: an evicted one terminates for a while."""
        pods = core.list_namespaced_pod(namespace).items
        return sorted(p.metadata.name for p in pods if p.metadata.name.startswith(prefix)
                      and p.spec.node_name and not p.metadata.deletion_timestamp)  # fmt: skip

    wait_until(lambda: len(bound("batch-")) == 4, 120, "four offline holders placed")
    core.create_namespaced_pod(namespace, claim_pod("chat", "half", "online"))
    wait_until(lambda: bound("chat"), 180, "the online pod placed after preemption")
    left = bound("batch-")
    assert len(left) == 3, left  # one victim: the cheapest room
    reasons = [e.reason for e in core.list_namespaced_event(namespace).items
               if e.involved_object.name == "chat"]  # fmt: skip
    assert "Preempting" in reasons, reasons
    share_gpus = {dra.gpu_device(g.index): g.memory_mib for g in real.inventory.gpus
                  if not g.mig_instances}  # fmt: skip
    held = held_by_claims(cluster, namespace, real.name)
    assert all(mib <= share_gpus[device] for device, mib in held.items()), held
