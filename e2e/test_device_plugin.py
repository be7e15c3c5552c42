"""The device plugin in fake mode, for a KWOK node (or a bare node of its own), against a real
API server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from device_plugin.fake_kubelet import FakeKubelet
from device_plugin.kubelet import HEALTHY, api_pb2
from device_plugin.xid import XidKind, classify_xid, describe_xid
from e2e.cluster.local_cluster import DEFAULT_FLEET
from e2e.cluster.processes import wait_until
from e2e.plugin_process import plugin_process, stop_plugin
from infergrid import constants
from infergrid.assignment_annotation import (
    AssignedGpu,
    ContainerAssignment,
    PodAssignment,
    decode_assignment,
    encode_assignment,
)
from infergrid.fleet import load_fleet
from infergrid.inventory import decode_inventory
from infergrid.usage import decode_usage

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.unpoliced(
        "the tests write assignments directly, as the extender would, to test how the "
        "plugin reads them"
    ),
]

NODE = "l4-0"


@pytest.fixture()
def plugin(cluster, identities, tmp_path):
    """The plugin for a KWOK node of the fleet, as the chart's device plugin ServiceAccount
    (its token bound to the release's DaemonSet pod on that node)."""
    if not cluster.local:
        pytest.skip("runs the plugin for a node of the local fleet")
    kubeconfig = identities.plugin_kubeconfig(NODE, tmp_path / "plugin.kubeconfig")
    plugin_dir = Path(tempfile.mkdtemp(prefix="dp-e2e-", dir="/tmp"))
    kubelet = FakeKubelet(plugin_dir)
    kubelet.start()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "device_plugin.main",
            "--fake-fleet", str(DEFAULT_FLEET), "--node", NODE,
            "--plugin-dir", str(plugin_dir), "--metrics-port", "0", "--usage-interval", "1",
            # No kubelet records the fake kubelet's grants: marks go to the plugin's match.
            "--pod-resources-socket", "",
        ],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
    )  # fmt: skip
    try:
        assert kubelet.wait_registered(
            {constants.RESOURCE_GPU, constants.RESOURCE_VGPU}, timeout=30
        )
        yield kubelet, proc
    finally:
        stop_plugin(proc, kubelet, plugin_dir)


def test_publishes_inventory_usage_and_labels(cluster, plugin):
    core = client.CoreV1Api(cluster.api)
    fleet_node = next(n for n in load_fleet(DEFAULT_FLEET).nodes if n.name == NODE)

    def published() -> bool:
        annotations = core.read_node(NODE).metadata.annotations or {}
        return {constants.ANNOTATION_GPU_INVENTORY, constants.ANNOTATION_GPU_USAGE} <= set(
            annotations
        )

    wait_until(published, 60, "inventory and usage annotations on the node")
    node = core.read_node(NODE)
    inventory = decode_inventory(node.metadata.annotations[constants.ANNOTATION_GPU_INVENTORY])
    assert inventory == fleet_node.inventory
    first = decode_usage(node.metadata.annotations[constants.ANNOTATION_GPU_USAGE]).heartbeat
    assert datetime.now(UTC) - first < timedelta(seconds=30)
    assert node.metadata.labels[constants.LABEL_GPU_PRODUCT] == "NVIDIA-L4"
    assert node.metadata.labels[constants.LABEL_GPU_COUNT] == "4"

    def heartbeat_moved() -> bool:
        text = core.read_node(NODE).metadata.annotations[constants.ANNOTATION_GPU_USAGE]
        return decode_usage(text).heartbeat > first

    wait_until(heartbeat_moved, 30, "a newer usage heartbeat")


def test_a_pod_with_an_assignment_gets_the_matching_allocation(cluster, namespace, plugin):
    kubelet, _ = plugin
    core = client.CoreV1Api(cluster.api)
    gpu = load_fleet(DEFAULT_FLEET).nodes[2].inventory.gpus[1]
    assignment = PodAssignment(
        NODE,
        datetime.now(UTC),
        (ContainerAssignment("engine", (AssignedGpu(gpu.uuid, 8192, 40),), shared=True),),
    )
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {
                "name": "shared-engine",
                "annotations": {constants.ANNOTATION_GPU_ASSIGNMENT: encode_assignment(assignment)},
            },
            "spec": {
                "schedulerName": constants.SCHEDULER_NAME,
                "nodeName": NODE,
                "containers": [
                    {
                        "name": "engine",
                        "image": "infergrid/engine",
                        "resources": {
                            "limits": {
                                constants.RESOURCE_VGPU: "1",
                                constants.RESOURCE_GPU_MEMORY: "8192",
                                constants.RESOURCE_GPU_CORES: "40",
                            }
                        },
                    }
                ],
            },
        },
    )
    reply = kubelet.plugin(constants.RESOURCE_VGPU).Allocate(
        api_pb2.AllocateRequest(
            container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=[f"{gpu.uuid}::vgpu-3"])
            ]
        ),
        timeout=10,
    )
    response = reply.container_responses[0]
    assert [(m.host_path, m.container_path, m.read_only) for m in response.mounts] == [
        ("/dev/null", f"/var/run/nvidia-container-devices/{gpu.uuid}", True)
    ]
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert response.envs["INFERGRID_GPU_MEMORY_MIB"] == "8192"

    def marked() -> bool:
        pod = core.read_namespaced_pod("shared-engine", namespace)
        text = pod.metadata.annotations[constants.ANNOTATION_GPU_ASSIGNMENT]
        return decode_assignment(text).containers[0].allocated

    wait_until(marked, 30, "the container marked allocated in the annotation")


def test_a_malformed_assignment_is_refused_naming_its_field(cluster, namespace, plugin):
    """The refusal, which the kubelet puts in the pod's events, carries the decode error."""
    kubelet, _ = plugin
    core = client.CoreV1Api(cluster.api)
    gpu = load_fleet(DEFAULT_FLEET).nodes[2].inventory.gpus[0]
    assignment = PodAssignment(
        NODE, datetime.now(UTC), (ContainerAssignment("engine", (AssignedGpu(gpu.uuid, 1, 100),)),)
    )
    malformed = encode_assignment(assignment).replace('"memoryMiB":1', '"memoryMiB":0')
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {
                "name": "malformed",
                "annotations": {constants.ANNOTATION_GPU_ASSIGNMENT: malformed},
            },
            "spec": {
                "schedulerName": constants.SCHEDULER_NAME,
                "nodeName": NODE,
                "containers": [
                    {
                        "name": "engine",
                        "image": "infergrid/engine",
                        "resources": {"limits": {constants.RESOURCE_GPU: "1"}},
                    }
                ],
            },
        },
    )
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.plugin(constants.RESOURCE_GPU).Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[gpu.uuid])]
            ),
            timeout=10,
        )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"{namespace}/malformed: " in refused.value.details()
    assert "containers[0].gpus[0].memoryMiB" in refused.value.details()


def test_sigterm_stops_the_plugin_and_removes_its_sockets(plugin):
    kubelet, proc = plugin
    sockets = [kubelet.plugin_dir / r.endpoint for r in kubelet.registrations]
    assert all(s.exists() for s in sockets)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert not any(s.exists() for s in sockets)


RESET_XID = 48  # double-bit ECC: the GPU computes wrong until it is reset
PASSING_XID = 32  # invalid push buffer stream: neither the application's fault nor a reset's
QUIET_S = 3  # the plugin's healthQuietPeriodSeconds
XIDS_AFTER_S = 10  # after the plugin starts: it has registered and published by then
E2E_ONLY_TAINT = {"key": "infergrid.io/e2e-only", "value": "xid", "effect": "NoSchedule"}


@pytest.fixture()
def faulty_plugin(cluster, tmp_path):
    """A plugin whose fake NVML reports RESET_XID on GPU 0 and PASSING_XID on GPU 1.

    It publishes onto a bare node of its own (no kubelet, no KWOK, tainted), so the
    shared fleet nodes never see its faults; the node is deleted afterwards. No DaemonSet
    pod reaches that node, so no token can be bound to one there: this plugin holds the
    admin's kubeconfig (e2e/README.md).
    """
    if not cluster.local:
        pytest.skip("runs the plugin for a node it creates on the local cluster")
    core = client.CoreV1Api(cluster.api)
    node = f"xid-{uuid.uuid4().hex[:8]}"
    fleet = tmp_path / "fleet.yaml"
    xids = [{"gpu": 0, "xid": RESET_XID, "afterSeconds": XIDS_AFTER_S},
            {"gpu": 1, "xid": PASSING_XID, "afterSeconds": XIDS_AFTER_S}]  # fmt: skip
    gpus = {"model": "NVIDIA L4", "count": 2, "memoryMiB": 23034, "smCount": 58,
            "computeCapability": "8.9"}  # fmt: skip
    fleet.write_text(yaml.safe_dump({"version": "v1", "nodes": [
        {"name": node, "gpus": gpus, "xidEvents": xids}]}))  # fmt: skip
    core.create_node({"metadata": {"name": node}, "spec": {"taints": [E2E_ONLY_TAINT]}})
    log = tmp_path / "plugin.log"
    args = ("--usage-interval", "0.5", "--health-quiet-period", str(QUIET_S))
    try:
        with plugin_process(cluster.kubeconfig, fleet, node, log, *args) as (kubelet, _):
            yield kubelet, load_fleet(fleet).nodes[0], log
    finally:
        core.delete_node(node)


class HealthHistory:
    """Each GPU's health (uuid -> healthy) as one source showed it: every change, in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: list[dict[str, bool]] = []

    def record(self, health: dict[str, bool]) -> None:
        with self._lock:
            if not self._seen or self._seen[-1] != health:
                self._seen.append(health)

    def of(self, gpu_uuid: str) -> list[bool]:
        """The GPU's health at each change of it: [True, False, True] is a fault that passed."""
        with self._lock:
            values = [seen[gpu_uuid] for seen in self._seen if gpu_uuid in seen]
        return [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


def follow_list_and_watch(stub, history: HealthHistory, done: threading.Event):
    """Records every device list the plugin streams, as the kubelet receives them; returns the
    stream, to cancel at the end."""
    stream = stub.ListAndWatch(api_pb2.Empty())

    def read() -> None:
        try:
            for response in stream:
                history.record({d.ID: d.health == HEALTHY for d in response.devices})
        except grpc.RpcError:
            if not done.is_set():
                raise

    threading.Thread(target=read, name="list-and-watch", daemon=True).start()
    return stream


def poll_published(core, node: str, history: HealthHistory, done: threading.Event) -> None:
    """Records the health in the node's inventory annotation every 0.1 s, in a thread."""

    def poll() -> None:
        while not done.wait(0.1):
            try:
                text = (core.read_node(node).metadata.annotations or {}).get(
                    constants.ANNOTATION_GPU_INVENTORY
                )
            except ApiException:
                continue
            if text:
                history.record({g.uuid: g.healthy for g in decode_inventory(text).gpus})

    threading.Thread(target=poll, name="published-health", daemon=True).start()


def published_heartbeat(core, node: str) -> datetime:
    text = core.read_node(node).metadata.annotations[constants.ANNOTATION_GPU_USAGE]
    return decode_usage(text).heartbeat


def test_a_passing_xid_recovers_and_one_that_needs_a_reset_stays_unhealthy(cluster, faulty_plugin):
    assert classify_xid(RESET_XID) is XidKind.NEEDS_RESET
    assert classify_xid(PASSING_XID) is XidKind.TRANSIENT
    kubelet, fleet_node, log = faulty_plugin
    gpu0, gpu1 = (gpu.uuid for gpu in fleet_node.inventory.gpus)
    core = client.CoreV1Api(cluster.api)
    streamed, published, done = HealthHistory(), HealthHistory(), threading.Event()
    stream = follow_list_and_watch(kubelet.plugin(constants.RESOURCE_GPU), streamed, done)
    poll_published(core, fleet_node.name, published, done)
    try:
        wait_until(lambda: published.of(gpu0) and published.of(gpu1), 30, "a first inventory")
        assert (published.of(gpu0), published.of(gpu1)) == ([True], [True]), (
            f"the XIDs came before the test watched; see {log}"
        )

        def gpu1_recovered() -> bool:
            return streamed.of(gpu1) == published.of(gpu1) == [True, False, True]

        wait_until(gpu1_recovered, XIDS_AFTER_S + QUIET_S + 30, "GPU 1 unhealthy, then healthy")
        recovered = datetime.now(UTC)
        later = recovered + timedelta(seconds=QUIET_S + 1)
        wait_until(
            lambda: published_heartbeat(core, fleet_node.name) > later,
            30,
            "a heartbeat a quiet period after GPU 1 recovered",
        )
        assert streamed.of(gpu0) == published.of(gpu0) == [True, False]
        inventory = core.read_node(fleet_node.name).metadata.annotations[
            constants.ANNOTATION_GPU_INVENTORY
        ]
        assert [g.healthy for g in decode_inventory(inventory).gpus] == [False, True]
    finally:
        done.set()
        stream.cancel()
    lines = log.read_text().splitlines()
    assert any(
        f"GPU {gpu0} is unhealthy until it is reset" in line
        and f"{describe_xid(RESET_XID)}: needs a GPU reset" in line
        for line in lines
    ), f"no reset reason for GPU 0 in {log}"
    assert any(f"GPU {gpu1} is unhealthy: {describe_xid(PASSING_XID)}" in line for line in lines)
    assert any(f"GPU {gpu1} is healthy again" in line for line in lines)
