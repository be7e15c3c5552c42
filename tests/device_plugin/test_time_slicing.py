"""Time slices at the kubelet's gate: with ``gpuReplicas: N`` Allocate hands one GPU to up to N
``nvidia.com/gpu`` containers, each a replica device ``<uuid>::<r>`` that shows the whole GPU
with a memory budget of 1/N of it, and refuses the next with the placement core's reason;
GetPreferredAllocation steers the kubelet to a free replica of the GPU the extender assigned."""

from __future__ import annotations

from dataclasses import replace

import grpc
import pytest

from device_plugin.allocator import AllocationError, grant
from device_plugin.config import PluginConfig
from device_plugin.devices import by_id, resource_devices
from device_plugin.discovery import discover
from device_plugin.kubelet import api_pb2
from device_plugin.ledger import Ledger, pending_on
from device_plugin.manager import DeviceManager
from device_plugin.preferred import preferred_devices
from device_plugin.visibility import MOUNT_DIR
from infergrid.constants import RESOURCE_GPU
from infergrid.fleet import load_fleet
from infergrid.inventory import node_capacity
from infergrid.nvml.fake import FakeNvml
from tests.device_plugin.conftest import SAMPLE, pod, share, whole
from tests.device_plugin.test_allocator import INVENTORY, UUIDS
from tests.device_plugin.test_kubelet_protocol import allocate, first_list, mounted

CONFIG = PluginConfig(node_name="n", gpu_replicas=2, vgpu_slots_per_gpu=4, mps=True)
DEVICES = by_id(resource_devices(INVENTORY, CONFIG, lambda uuid: True))
A, B = UUIDS
MIB = 1000  # the fleet's GPUs


def replica(uuid: str, r: int) -> str:
    return f"{uuid}::{r}"


def sliced(name: str, *uuids: str, age_s: int = 0):
    """A pod the extender gave a time slice of each of ``uuids``."""
    return pod(name, "n", whole("c", *uuids, memory=MIB), age_s=age_s)


def confirmed(*pods) -> Ledger:
    """A ledger whose grants the kubelet has shown held by these pods' containers."""
    return Ledger({(p.uid, c.name): c for p in pods for c in p.assignment.containers})


def test_two_pods_get_time_slices_of_one_gpu_each_seeing_all_of_it_with_half_its_memory():
    """Both engines start: each sizes itself to half the card, and neither gets MPS limits."""
    pods = [sliced("a", A), sliced("b", A, age_s=1)]
    ledger = Ledger()
    grants = [grant([replica(A, r)], DEVICES, "n", pods, ledger, CONFIG) for r in (0, 1)]
    for granted in grants:
        assert granted.envs == {
            "NVIDIA_VISIBLE_DEVICES": MOUNT_DIR,
            "INFERGRID_GPU_MEMORY_MIB": "500",
        }
        assert [m.container_path for m in granted.mounts] == [f"{MOUNT_DIR}/{A}"]
    assert sorted(g.pending.pod.name for g in grants) == ["a", "b"]


def test_the_time_slice_beyond_n_is_refused_naming_the_gpu_and_n():
    holders = [sliced("a", A), sliced("b", A)]
    late = sliced("c", A, age_s=5)
    with pytest.raises(AllocationError) as refused:
        grant([replica(A, 1)], DEVICES, "n", [*holders, late], confirmed(*holders), CONFIG)
    assert str(refused.value) == (
        "pod default/c does not fit beside the containers already granted: container 'c': "
        f"{A} (index 0): time-sliced: 2 of 2 time slices taken"
    )


def test_without_time_slicing_a_second_holder_is_refused_as_before():
    config = replace(CONFIG, gpu_replicas=1)
    devices = by_id(resource_devices(INVENTORY, config, lambda uuid: True))
    holder, late = sliced("a", A), sliced("b", A, age_s=5)
    with pytest.raises(AllocationError, match="held whole by another pod"):
        grant([A], devices, "n", [holder, late], confirmed(holder), config)


def test_time_slices_and_shares_never_meet_on_a_gpu():
    on_a, on_b = pod("s", "n", share("c", A, 100, cores=10)), sliced("t", B)
    slice_on_a, share_on_b = sliced("x", A, age_s=5), pod("y", "n", share("c", B, 100), age_s=5)
    ledger = confirmed(on_a, on_b)
    with pytest.raises(AllocationError, match=r"holds 1 share\(s\)"):
        grant([replica(A, 0)], DEVICES, "n", [slice_on_a], ledger, CONFIG)
    with pytest.raises(AllocationError, match="time-sliced: 1 of 2 time slices taken"):
        grant([f"{B}::vgpu-0"], DEVICES, "n", [share_on_b], ledger, CONFIG)


def test_a_container_gets_one_time_slice_of_each_gpu_never_two_of_one():
    with pytest.raises(AllocationError, match=f"one time slice of each GPU; the request names {A}"):
        grant([replica(A, 0), replica(A, 1)], DEVICES, "n", [sliced("a", A, B)], Ledger(), CONFIG)
    granted = grant(
        [replica(B, 1), replica(A, 0)], DEVICES, "n", [sliced("a", A, B)], Ledger(), CONFIG
    )
    assert [m.container_path for m in granted.mounts] == [f"{MOUNT_DIR}/{u}" for u in sorted(UUIDS)]


def test_preferred_is_a_free_replica_of_each_assigned_gpu():
    offered = [DEVICES[replica(u, r)] for u in (A, B) for r in (0, 1)]

    def prefer(available, size, *pods) -> list[str]:
        pending = pending_on("n", list(pods), Ledger())
        return [d.id for d in preferred_devices(available, [], size, pending)]

    assert prefer(offered, 1, sliced("a", B)) == [replica(B, 0)]
    assert prefer(offered[:3], 1, sliced("a", B)) == [replica(B, 0)]
    assert prefer([offered[0], offered[3]], 1, sliced("a", B)) == [replica(B, 1)]
    assert prefer(offered, 2, sliced("a", A, B)) == [replica(A, 0), replica(B, 0)]
    assert prefer(offered, 2) == [replica(A, 0), replica(B, 0)]  # no assignment: distinct GPUs
    assert prefer(offered[:2], 1, sliced("a", B)) == [replica(A, 0)]  # B's replicas all held


class Unreadable:
    """A pod source whose API server does not answer."""

    def pods(self):
        raise AllocationError("the API server did not answer")


def test_without_the_pods_the_preference_falls_back_to_distinct_gpus(caplog):
    manager = DeviceManager(CONFIG, INVENTORY, lambda uuid: True, Unreadable())
    offered = [replica(u, r) for u in (A, B) for r in (0, 1)]
    assert manager.preferred(RESOURCE_GPU, offered, [], 2) == [replica(A, 0), replica(B, 0)]
    assert "without the assignments: the API server did not answer" in caplog.text


@pytest.mark.parametrize("replicas", [1, 2, 5])
def test_the_kubelet_is_offered_what_node_capacity_advertises(replicas):
    """One rule, two readers: the devices the plugin lists and the capacity a KWOK node or
    the extender's view takes from the published inventory."""
    node = next(n for n in load_fleet(SAMPLE).nodes if n.name == "a100-1")
    config = PluginConfig(node_name=node.name, gpu_replicas=replicas, vgpu_slots_per_gpu=3)
    inventory = discover(FakeNvml(node), node.name, None, 3, replicas)
    unhealthy = inventory.gpus[1].uuid
    inventory = replace(
        inventory, gpus=tuple(replace(g, healthy=g.uuid != unhealthy) for g in inventory.gpus)
    )
    listed = resource_devices(inventory, config, lambda uuid: True)
    offered = {name: str(sum(d.healthy for d in devices)) for name, devices in listed.items()}
    assert node_capacity(inventory) == offered
    assert inventory.time_slices == replicas


def test_through_grpc_two_pods_share_the_assigned_gpu_by_its_replicas(start_plugin):
    p = start_plugin("l4-0", gpu_replicas=2)
    p.kubelet.wait_registered({RESOURCE_GPU})
    target = p.gpu(2).uuid
    p.pods.items = [
        pod("a", "l4-0", whole("c", target)),
        pod("b", "l4-0", whole("c", target), age_s=1),
    ]
    stub = p.kubelet.plugin(RESOURCE_GPU)
    assert p.runtime.manager.inventory.time_slices == 2  # what the publisher writes
    free = [d.ID for d in first_list(stub)]
    for _ in range(2):
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=free, allocation_size=1
                )
            ]
        )
        (chosen,) = stub.GetPreferredAllocation(request, timeout=5).container_responses[0].deviceIDs
        assert chosen.startswith(f"{target}::")
        response = allocate(stub, [chosen]).container_responses[0]
        assert mounted(response) == [target]
        assert response.envs["INFERGRID_GPU_MEMORY_MIB"] == str(p.gpu(2).memory_mib // 2)
        free.remove(chosen)
    assert sorted(g.pending.pod.name for g in p.granted) == ["a", "b"]
    with pytest.raises(grpc.RpcError) as refused:
        allocate(stub, [f"{p.gpu(0).uuid}::0"])
    assert "no unallocated whole assignment on node l4-0" in refused.value.details()
