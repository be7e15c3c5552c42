"""The committed gRPC stubs are exactly what grpcio-tools makes from the official proto."""

from device_plugin.kubelet import api_pb2
from device_plugin.kubelet.codegen import OUTPUTS, PROTO, ROOT, generate_into


def test_generated_stubs_match_the_proto(tmp_path):
    for fresh in generate_into(tmp_path):
        committed = ROOT / PROTO.parent / fresh.name
        assert committed.read_text() == fresh.read_text(), f"{committed.name} is stale: make protos"
    assert len(OUTPUTS) == 3


def test_the_services_are_the_kubelets_v1beta1_ones():
    services = api_pb2.DESCRIPTOR.services_by_name
    assert services["Registration"].full_name == "v1beta1.Registration"
    methods = {m.name for m in services["DevicePlugin"].methods}
    assert methods == {
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    }
