"""The plugin learns from the kubelet's PodResources API which pod each grant went to.

Over real unix-socket gRPC: a fake kubelet calls Allocate, a fake PodResources
server lists what the kubelet recorded afterwards, as the real one does.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import grpc
import pytest

from device_plugin import metrics
from device_plugin.fake_pod_resources import FakePodResources
from device_plugin.pod_resources import PodResourcesClient
from infergrid.constants import RESOURCE_VGPU
from tests.device_plugin.conftest import pod, share
from tests.device_plugin.test_kubelet_protocol import allocate


@pytest.fixture()
def kubelet_pod_resources(short_dir):
    fake = FakePodResources(short_dir / "pod-resources.sock")
    fake.start()
    yield fake
    fake.stop()


def wait_for(condition, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def marked(p) -> list[tuple[str, tuple[str, ...]]]:
    return [(g.pending.pod.name, g.device_ids) for g in p.granted]


def test_two_shares_admitted_against_assignment_order_each_end_with_their_own_pod(
    start_plugin, kubelet_pod_resources
):
    fake = kubelet_pod_resources
    client = PodResourcesClient(str(fake.socket))
    p = start_plugin("l4-0", held=client)
    p.kubelet.wait_registered({RESOURCE_VGPU})
    g = p.gpu(0).uuid
    small = pod("small", "l4-0", share("c", g, 4096, cores=20), age_s=1)
    large = pod("large", "l4-0", share("c", g, 12288, cores=40), age_s=2)
    p.pods.items = [small, large]
    stub = p.kubelet.plugin(RESOURCE_VGPU)

    first = allocate(stub, [f"{g}::vgpu-0"]).container_responses[0]  # the kubelet admits `large`
    assert first.envs["INFERGRID_GPU_MEMORY_MIB"] == "4096"  # either pod's limit holds
    fake.hold("default", "large", "c", RESOURCE_VGPU, f"{g}::vgpu-0")
    assert wait_for(lambda: marked(p) == [("large", (f"{g}::vgpu-0",))])

    second = allocate(stub, [f"{g}::vgpu-1"]).container_responses[0]
    assert second.envs["INFERGRID_GPU_MEMORY_MIB"] == "4096"
    fake.hold("default", "small", "c", RESOURCE_VGPU, f"{g}::vgpu-1")
    assert wait_for(lambda: ("small", (f"{g}::vgpu-1",)) in marked(p))
    ledger = p.runtime.manager.ledger
    assert ledger.honoured == {
        ("uid-large", "c"): large.assignment.containers[0],
        ("uid-small", "c"): small.assignment.containers[0],
    }

    fake.release("default", "large")  # `large` ends: its 12288 MiB are free, `small` keeps 4096
    p.pods.items = [small, pod("next", "l4-0", share("c", g, 18000, cores=60), age_s=3)]
    third = allocate(stub, [f"{g}::vgpu-0"]).container_responses[0]
    assert third.envs["INFERGRID_GPU_MEMORY_MIB"] == "18000"
    assert set(p.runtime.manager.ledger.honoured) == {("uid-small", "c"), ("uid-next", "c")}


def test_a_restarted_plugin_rebuilds_from_the_kubelet_and_refuses_an_over_commit(
    start_plugin, kubelet_pod_resources
):
    """Every `allocated` mark was lost; the kubelet still lists who holds the GPU."""
    fake = kubelet_pod_resources
    p = start_plugin("l4-0", held=PodResourcesClient(str(fake.socket)))
    p.kubelet.wait_registered({RESOURCE_VGPU})
    g = p.gpu(0).uuid
    fake.hold("default", "running", "c", RESOURCE_VGPU, f"{g}::vgpu-3")
    p.pods.items = [
        pod("running", "l4-0", share("c", g, 16384)),
        pod("newcomer", "l4-0", share("c", g, 16384), age_s=5),
    ]
    with pytest.raises(grpc.RpcError) as refused:
        allocate(p.kubelet.plugin(RESOURCE_VGPU), [f"{g}::vgpu-0"])
    assert "MiB free, needs 16384" in refused.value.details()
    assert list(p.runtime.manager.ledger.honoured) == [("uid-running", "c")]


def test_without_the_kubelets_answer_the_ledger_falls_back_to_marks_and_says_so(
    start_plugin, short_dir, caplog
):
    socket = short_dir / "nobody.sock"
    before = metrics.POD_RESOURCES_FALLBACKS.labels("ledger")._value.get()
    p = start_plugin("l4-0", held=PodResourcesClient(str(socket), timeout_s=0.5))
    p.kubelet.wait_registered({RESOURCE_VGPU})
    g = p.gpu(0).uuid
    running = pod("running", "l4-0", replace(share("c", g, 16384), allocated=True))
    p.pods.items = [running, pod("newcomer", "l4-0", share("c", g, 16384), age_s=5)]
    with caplog.at_level(logging.WARNING), pytest.raises(grpc.RpcError) as refused:
        allocate(p.kubelet.plugin(RESOURCE_VGPU), [f"{g}::vgpu-0"])
    message = refused.value.details()
    assert "MiB free, needs 16384" in message
    assert f"the kubelet's PodResources API at {socket} did not answer (UNAVAILABLE" in message
    assert "the ledger was seeded from allocation marks" in message
    assert f"PodResources API at {socket} did not answer" in caplog.text
    assert metrics.POD_RESOURCES_FALLBACKS.labels("ledger")._value.get() == before + 1


def test_without_the_kubelets_answer_the_guess_is_marked_as_before(start_plugin, short_dir):
    p = start_plugin("l4-0", held=PodResourcesClient(str(short_dir / "nobody.sock")))
    p.kubelet.wait_registered({RESOURCE_VGPU})
    g = p.gpu(0).uuid
    p.pods.items = [pod("only", "l4-0", share("c", g, 4096))]
    allocate(p.kubelet.plugin(RESOURCE_VGPU), [f"{g}::vgpu-0"])
    assert wait_for(lambda: marked(p) == [("only", (f"{g}::vgpu-0",))])


def test_the_client_answers_none_when_the_socket_is_unreachable(short_dir):
    client = PodResourcesClient(str(short_dir / "missing.sock"), timeout_s=0.5)
    started = time.monotonic()
    assert client.list() is None
    assert time.monotonic() - started < 5
    assert "did not answer (UNAVAILABLE" in client.describe()
    client.close()


def test_the_client_reads_what_each_container_holds(kubelet_pod_resources):
    fake = kubelet_pod_resources
    fake.hold("team", "a", "main", RESOURCE_VGPU, "GPU-1::vgpu-2")
    fake.hold("team", "a", "side", "nvidia.com/gpu", "GPU-0", "GPU-3")
    client = PodResourcesClient(str(fake.socket))
    held = client.list()
    assert held is not None
    assert {(h.pod, h.container, h.resource, h.devices) for h in held} == {
        ("a", "main", RESOURCE_VGPU, frozenset({"GPU-1::vgpu-2"})),
        ("a", "side", "nvidia.com/gpu", frozenset({"GPU-0", "GPU-3"})),
    }
    client.close()
