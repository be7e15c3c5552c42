"""The real node: a kubelet with containerd where pods really run, and InferGrid's device
plugin registered with that kubelet over its unix socket (on fake NVML without a GPU)."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client

from device_plugin.endpoint import socket_identity
from e2e.cluster.local_cluster import DEFAULT_FLEET, LocalCluster
from e2e.cluster.node_configs import DEVICE_PLUGIN_DIR
from e2e.cluster.processes import wait_until
from e2e.cluster.real_node import capacity_advertised
from e2e.real_pods import REAL_NODE_LABEL, logs_of, shell_pod, wait_phase
from images import cluster_binaries
from infergrid import constants
from infergrid.assignment_annotation import (
    AssignedGpu,
    ContainerAssignment,
    PodAssignment,
    decode_assignment,
    encode_assignment,
)
from infergrid.fleet import FleetNode, load_fleet
from infergrid.inventory import node_capacity

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.unpoliced(
        "the real node's plugin is the cluster's process with the admin's kubeconfig, "
        "and the plugin's own refusal of forged assignments is tested where no policy "
        "stops them first"
    ),
]


@pytest.fixture(scope="module")
def real(cluster) -> FleetNode:
    if not cluster.local:
        pytest.skip("starts and restarts the local cluster's own kubelet")
    return next(n for n in load_fleet(DEFAULT_FLEET).nodes if n.real)


def test_the_kubelet_registers_the_node_and_advertises_the_plugins_gpus(cluster, real):
    node = client.CoreV1Api(cluster.api).read_node(real.name)
    assert node.metadata.labels[REAL_NODE_LABEL] == "true"
    info = node.status.node_info
    assert info.kubelet_version == cluster_binaries.versions()["K8S_VERSION"]
    assert info.container_runtime_version.startswith("containerd://")
    (internal,) = [a.address for a in node.status.addresses if a.type == "InternalIP"]
    assert internal.startswith("10.85.")
    # What the kubelet reports comes from the device plugin's ListAndWatch, nowhere else.
    wanted = node_capacity(real.inventory)
    assert {k: node.status.capacity[k] for k in wanted} == wanted
    assert (DEVICE_PLUGIN_DIR / "kubelet.sock").is_socket()


def test_a_pod_runs_in_a_container_and_its_logs_come_back(cluster, namespace, real):
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_pod(namespace, shell_pod("hello", "echo hello from $(hostname)"))
    pod = wait_phase(core, namespace, "hello", "Succeeded")
    assert pod.spec.node_name == real.name
    assert logs_of(core, namespace, "hello").strip() == "hello from hello"


def allocated_env(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, str]:
    wait_phase(core, namespace, name, "Running")
    wait_until(lambda: "ready" in logs_of(core, namespace, name), 60, f"{name} to print its env")
    lines = logs_of(core, namespace, name).splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def assigned(core: client.CoreV1Api, namespace: str, name: str):
    pod = core.read_namespaced_pod(name, namespace)
    return decode_assignment(pod.metadata.annotations[constants.ANNOTATION_GPU_ASSIGNMENT])


ENV_SCRIPT = (
    "env | grep -E '^(NVIDIA|INFERGRID|CUDA)_' | sort; "
    "echo MOUNTED_DEVICES=$(ls /var/run/nvidia-container-devices | sort | paste -sd, -); "
    "echo ready; sleep 3600"
)
"""Prints the container's GPU envs and the device list the kubelet mounted (volume-mounts)."""


@pytest.mark.parametrize(
    ("kind", "limits"),
    [
        ("whole", {constants.RESOURCE_GPU: "1"}),
        ("share", {constants.RESOURCE_VGPU: "1", constants.RESOURCE_GPU_MEMORY: "20000",
                   constants.RESOURCE_GPU_CORES: "30"}),
        ("mig", {constants.mig_resource("3g.40gb"): "1"}),
    ],
)  # fmt: skip
def test_allocate_gives_the_container_the_gpu_the_extender_assigned(
    cluster, namespace, extender, real, kind, limits
):
    core = client.CoreV1Api(cluster.api)
    name = f"{kind}-{uuid.uuid4().hex[:6]}"
    pod = shell_pod(name, ENV_SCRIPT, limits=limits, scheduler=constants.SCHEDULER_NAME)
    core.create_namespaced_pod(namespace, pod)
    env = allocated_env(core, namespace, name)
    (container,) = assigned(core, namespace, name).containers
    inventory = {g.uuid: g for g in real.inventory.gpus}
    if kind == "mig":
        migs = {m.uuid for g in real.inventory.gpus for m in g.mig_instances}
        assert container.mig.uuid in migs
        assert env["MOUNTED_DEVICES"] == container.mig.uuid
    else:
        (gpu,) = container.gpus
        assert gpu.uuid in inventory
        assert env["MOUNTED_DEVICES"] == gpu.uuid
    # The default device list strategy: the runtime reads the list from the mounts alone.
    assert env["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    if kind == "share":
        # Asked as 20000, stored by the API server as 20k: the same 20000 MiB.
        asked = core.read_namespaced_pod(name, namespace).spec.containers[0].resources.limits
        assert asked[constants.RESOURCE_GPU_MEMORY] == "20k"
        assert env["INFERGRID_GPU_MEMORY_MIB"] == "20000"
    wait_until(lambda: assigned(core, namespace, name).containers[0].allocated, 30,
               "the container marked allocated")  # fmt: skip


def test_a_gpu_pod_without_an_assignment_fails_admission_with_the_plugins_reason(
    cluster, namespace, real
):
    """Placed by nodeName, past every scheduler: the kubelet asks the plugin to Allocate, the
    plugin refuses, and the kubelet fails the pod with the plugin's own message."""
    core = client.CoreV1Api(cluster.api)
    pod = shell_pod("sneaky", "sleep 3600", limits={constants.RESOURCE_GPU: "1"})
    pod["spec"]["nodeName"] = real.name
    core.create_namespaced_pod(namespace, pod)
    failed = wait_phase(core, namespace, "sneaky", "Failed")
    assert failed.status.reason == "UnexpectedAdmissionError"
    assert "Allocate failed" in failed.status.message
    assert f"no unallocated whole assignment on node {real.name}" in failed.status.message


def test_a_kubelet_restart_keeps_pods_running_and_the_plugin_registers_again(
    cluster, namespace, real, record_property
):
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_pod(namespace, shell_pod("survivor", "sleep 3600"))
    before = wait_phase(core, namespace, "survivor", "Running").status.container_statuses[0]
    local = LocalCluster()
    plugin_log = local.processes.logs / f"device-plugin-{real.name}.log"
    registrations = plugin_log.read_text().count("registered ")
    socket = DEVICE_PLUGIN_DIR / "kubelet.sock"
    old = socket_identity(socket)
    local.real_nodes.restart_kubelet(real.name)
    wait_until(lambda: socket_identity(socket) not in (None, old), 60, "a new kubelet.sock")
    started = time.monotonic()
    resources = len(node_capacity(real.inventory))
    wait_until(
        lambda: plugin_log.read_text().count("registered ") >= registrations + resources,
        30,
        "the device plugin to register every resource again",
    )
    seconds = round(time.monotonic() - started, 2)
    record_property("reregistered_after_s", seconds)
    print(f"device plugin registered again {seconds} s after the new kubelet.sock appeared")
    wait_until(lambda: capacity_advertised(core, real), 60, "the GPUs advertised again")
    after = core.read_namespaced_pod("survivor", namespace).status
    assert after.phase == "Running"
    assert after.container_statuses[0].container_id == before.container_id
    assert after.container_statuses[0].restart_count == 0


def unmarked(assignment: PodAssignment) -> PodAssignment:
    """The assignment as if the plugin's `allocated` mark had never been written."""
    containers = tuple(replace(c, allocated=False) for c in assignment.containers)
    return replace(assignment, containers=containers)


def placed_past_the_scheduler(
    name: str, script: str, node: str, gpu: str, mib: int, at: datetime | None = None
) -> dict:
    """A share pod bound by nodeName, past every scheduler, while naming ours (the plugin
    cannot tell), with the assignment written where no admission policy runs: a share of
    `gpu` for its container `main`, as if the extender had placed it at `at` (now)."""
    share = ContainerAssignment("main", (AssignedGpu(gpu, mib, 0),), shared=True)
    text = encode_assignment(PodAssignment(node, at or datetime.now(UTC), (share,)))
    limits = {constants.RESOURCE_VGPU: "1", constants.RESOURCE_GPU_MEMORY: str(mib)}
    pod = shell_pod(name, script, limits)
    pod["spec"].update(nodeName=node, schedulerName=constants.SCHEDULER_NAME)
    pod["metadata"]["annotations"] = {constants.ANNOTATION_GPU_ASSIGNMENT: text}
    return pod


def test_a_plugin_restart_with_the_marks_lost_still_refuses_an_over_commit(
    cluster, namespace, extender, real
):
    """Issue 18, point 6: the plugin rebuilds what it granted from the kubelet's PodResources
    API, not from the `allocated` marks in annotations. A share holds 60000 MiB of a GPU,
    its mark is wiped, the plugin restarts, and a pod placed past the scheduler with a
    forged 40000 MiB share of the same 81920 MiB GPU is refused by Allocate."""
    core = client.CoreV1Api(cluster.api)
    limits = {constants.RESOURCE_VGPU: "1", constants.RESOURCE_GPU_MEMORY: "60000"}
    core.create_namespaced_pod(
        namespace, shell_pod("holder", "sleep 3600", limits, scheduler=constants.SCHEDULER_NAME)
    )
    wait_phase(core, namespace, "holder", "Running")
    wait_until(lambda: assigned(core, namespace, "holder").containers[0].allocated, 30,
               "the holder marked allocated")  # fmt: skip
    held = assigned(core, namespace, "holder")
    (gpu,) = held.containers[0].gpus
    wiped = {"metadata": {"annotations": {
        constants.ANNOTATION_GPU_ASSIGNMENT: encode_assignment(unmarked(held))}}}  # fmt: skip
    core.patch_namespaced_pod("holder", namespace, wiped)
    with LocalCluster().host_device_plugin_stopped(real):
        pass  # stopped, started again: its ledger is gone, the marks are too

    intruder = placed_past_the_scheduler("intruder", "sleep 3600", real.name, gpu.uuid, 40000)
    core.create_namespaced_pod(namespace, intruder)
    failed = wait_phase(core, namespace, "intruder", "Failed")
    assert failed.status.reason == "UnexpectedAdmissionError"
    assert "does not fit beside the containers already granted" in failed.status.message
    assert gpu.uuid in failed.status.message or "free" in failed.status.message
    holder = core.read_namespaced_pod("holder", namespace).status
    assert holder.phase == "Running"


def test_two_shares_admitted_together_never_get_more_than_their_own_and_are_marked_by_identity(
    cluster, namespace, real
):
    """Issue 18, point 6: the kubelet names devices, not pods. Two shares of one GPU with
    different sizes wait for admission at once, the later-assigned one created first: each
    container's memory limit is at most its own share, and each pod's `allocated` mark is
    written on the pod the kubelet's PodResources shows holding the devices."""
    core = client.CoreV1Api(cluster.api)
    gpu = next(g for g in real.inventory.gpus if not g.mig_instances)
    now = datetime.now(UTC)
    sizes = {"small": 2048, "large": 3072}  # room beside what earlier tests still hold
    # `large` is assigned first but created second: by assignedAt it would be matched first.
    order = {"large": now - timedelta(seconds=30), "small": now}
    for name in ("small", "large"):
        pod = placed_past_the_scheduler(
            name, ENV_SCRIPT, real.name, gpu.uuid, sizes[name], order[name]
        )
        core.create_namespaced_pod(namespace, pod)
    for name, mib in sizes.items():
        env = allocated_env(core, namespace, name)
        assert int(env["INFERGRID_GPU_MEMORY_MIB"]) <= mib, name
        assert env["MOUNTED_DEVICES"] == gpu.uuid
        wait_until(lambda n=name: assigned(core, namespace, n).containers[0].allocated, 30,
                   f"{name} marked allocated")  # fmt: skip
