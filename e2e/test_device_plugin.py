"""The device plugin in fake mode, for a KWOK node, against a real API server."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from kubernetes import client

from device_plugin.fake_kubelet import FakeKubelet
from device_plugin.kubelet import api_pb2
from e2e.cluster.local_cluster import DEFAULT_FLEET
from e2e.cluster.processes import wait_until
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

pytestmark = pytest.mark.e2e

NODE = "l4-0"


@pytest.fixture()
def plugin(cluster):
    if not cluster.local:
        pytest.skip("runs the plugin for a node of the local fleet")
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
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
    )  # fmt: skip
    try:
        assert kubelet.wait_registered(
            {constants.RESOURCE_GPU, constants.RESOURCE_VGPU}, timeout=30
        )
        yield kubelet, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


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
