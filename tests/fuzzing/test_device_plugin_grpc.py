"""The device plugin's DevicePlugin gRPC service, fuzzed over its real unix sockets.

One plugin on fake NVML for a node with whole GPUs, shares and MIG instances (a100-1), as
the plugin's own tests run it: registered with a fake kubelet, one socket per resource, and
the node's pods (a share, a whole GPU and a MIG instance waiting for Allocate) read from a
static list. Each unary RPC gets request bytes drawn from its message descriptor (the
advertised device ids, hostile text as raw UTF-8 or worse, duplicates, huge counts, int32
edges, unknown fields) and raw bytes, on a socket drawn per case. The property: every call
ends with a status (OK, or an error code with a message), none is an exception the servicer
let out, none hangs, and every socket still answers afterwards.
"""

from __future__ import annotations

import grpc
import pytest
from hypothesis import strategies as st

from device_plugin.kubelet import api_pb2
from device_plugin.server import MAX_STATUS_MESSAGE_BYTES, status_message
from infergrid.constants import RESOURCE_GPU, RESOURCE_VGPU
from tests.device_plugin.conftest import (  # noqa: F401 - fixtures used by name
    StaticPods,
    mig,
    pod,
    share,
    short_dir,
    whole,
)
from tests.device_plugin.conftest import start_plugin as start_plugin
from tests.fuzzing.grpc_fuzz import Rpc, fuzz_rpc
from tests.fuzzing.hostile import hostile_strings

NODE = "a100-1"
MIG = "nvidia.com/mig-3g.40gb"
RESOURCES = (RESOURCE_GPU, RESOURCE_VGPU, MIG)
SERVICE = api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"]
UNARY = [
    Rpc(SERVICE.full_name, m.name, m.input_type)
    for m in SERVICE.methods
    if not m.server_streaming and not m.client_streaming
]
RESPONSES = {m.name: m.output_type.full_name for m in SERVICE.methods}
EXAMPLES = {"Allocate": 200, "GetPreferredAllocation": 200}  # the rest read nothing: fewer
LABEL = "device-plugin grpc"


def decoder(rpc: Rpc):
    """Reads an OK answer as the RPC's response message; a malformed one raises."""
    cls = getattr(api_pb2, RESPONSES[rpc.name].rsplit(".", 1)[1])
    return cls.FromString


@pytest.fixture()
def plugin(start_plugin):
    """The plugin, its pods waiting for Allocate, and a channel and device ids per resource."""
    p = start_plugin(NODE)
    assert p.kubelet.wait_registered(set(RESOURCES))
    p.pods.items = [
        pod("share", NODE, share("engine", p.gpu(1).uuid, 8192)),
        pod("whole", NODE, whole("engine", p.gpu(2).uuid, memory=81920)),
        pod("mig", NODE, mig("engine", p.gpu(0).mig_instances[0].uuid, "3g.40gb", p.gpu(0).uuid)),
    ]
    channels = {}
    ids: list[str] = []
    for resource in RESOURCES:
        socket = p.kubelet.plugin_dir / p.kubelet.endpoint(resource)
        channels[resource] = grpc.insecure_channel(f"unix://{socket}")
        stream = p.kubelet.plugin(resource).ListAndWatch(api_pb2.Empty(), timeout=10)
        ids.extend(d.ID for d in next(stream).devices)
        stream.cancel()
    yield channels, ids
    for channel in channels.values():
        channel.close()


@pytest.mark.parametrize("rpc", UNARY, ids=[r.name for r in UNARY])
def test_every_unary_rpc_ends_with_a_status_and_the_plugin_keeps_serving(plugin, fuzz_budget, rpc):
    channels, ids = plugin
    words = st.one_of(st.sampled_from(ids), st.sampled_from(ids), hostile_strings(48))

    def channel_for(draw) -> grpc.Channel:
        return channels[draw(st.sampled_from(RESOURCES))]

    fuzz_rpc(channel_for, rpc, words, fuzz_budget(EXAMPLES.get(rpc.name, 40)), decoder(rpc), LABEL)
    for resource, channel in channels.items():
        options = api_pb2.DevicePluginOptions.FromString(
            channel.unary_unary(f"/{SERVICE.full_name}/GetDevicePluginOptions")(
                api_pb2.Empty().SerializeToString(), timeout=5
            )
        )
        assert options.get_preferred_allocation_available, resource


# What the fuzzer found, kept as plain regressions.


def test_a_reason_too_long_for_a_grpc_status_is_cut_saying_how_much():
    assert status_message("unknown device IDs: a, b") == "unknown device IDs: a, b"
    reason = "unknown device IDs: " + ", ".join(f"GPU-{i:08d}" for i in range(5000))
    cut = status_message(reason)
    assert len(cut.encode()) <= MAX_STATUS_MESSAGE_BYTES
    assert cut.startswith("unknown device IDs: GPU-00000000, ")
    assert cut.endswith(" more characters)")
    assert status_message("\U0001f469" * 4000).endswith(" more characters)")  # cut between bytes


@pytest.mark.parametrize("rpc", ["Allocate", "GetPreferredAllocation"])
def test_a_refusal_naming_thousands_of_unknown_ids_reaches_the_kubelet_with_its_reason(
    start_plugin, rpc
):
    """It came as RESOURCE_EXHAUSTED "received metadata size exceeds hard limit": the
    reason, naming every ID, was larger than the client takes in a status."""
    p = start_plugin(NODE)
    p.kubelet.wait_registered({RESOURCE_GPU})
    stub = p.kubelet.plugin(RESOURCE_GPU)
    ids = [f"GPU-unknown-{i:06d}" for i in range(5000)]
    if rpc == "Allocate":
        container = api_pb2.ContainerAllocateRequest(devices_ids=ids)
        request = api_pb2.AllocateRequest(container_requests=[container])
    else:
        container = api_pb2.ContainerPreferredAllocationRequest(
            available_deviceIDs=ids, allocation_size=1
        )
        request = api_pb2.PreferredAllocationRequest(container_requests=[container])
    with pytest.raises(grpc.RpcError) as refused:
        getattr(stub, rpc)(request, timeout=10)
    assert refused.value.code() in (
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert refused.value.details().startswith("unknown device IDs: GPU-unknown-000000, ")


class CountedPods(StaticPods):
    """The node's pods, counting how often the plugin reads them."""

    reads: int = 0

    def pods(self):
        self.reads += 1
        return super().pods()


def test_a_preference_for_many_containers_reads_the_pods_once_not_once_per_container(
    start_plugin,
):
    """Per container, a call naming 10,000 took seconds, and as many reads of the pods (the
    API server's, on a real node)."""
    pods = CountedPods()
    p = start_plugin(NODE, pods=pods)
    p.kubelet.wait_registered({RESOURCE_VGPU})
    stub = p.kubelet.plugin(RESOURCE_VGPU)
    slots = [d.ID for d in next(stub.ListAndWatch(api_pb2.Empty(), timeout=10)).devices]
    container = api_pb2.ContainerPreferredAllocationRequest(
        available_deviceIDs=slots, allocation_size=1
    )
    before = pods.reads
    reply = stub.GetPreferredAllocation(
        api_pb2.PreferredAllocationRequest(container_requests=[container] * 1000), timeout=20
    )
    assert len(reply.container_responses) == 1000
    assert pods.reads - before <= 2  # this call's one read, and at most one of another loop
