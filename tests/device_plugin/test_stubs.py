"""The committed gRPC stubs are exactly what grpcio-tools makes from the official proto."""

from device_plugin.kubelet import api_pb2
from device_plugin.kubelet.codegen import OUTPUTS, PROTOS, ROOT, generate_into
from device_plugin.kubelet.podresources import api_pb2 as podresources_pb2


def test_generated_stubs_match_the_proto(tmp_path):
    fresh_files = generate_into(tmp_path)
    for fresh in fresh_files:
        committed = ROOT / fresh.relative_to(tmp_path)
        assert committed.read_text() == fresh.read_text(), f"{committed} is stale: make protos"
    assert len(fresh_files) == len(OUTPUTS) * len(PROTOS) == 6


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


def test_the_pod_resources_service_is_the_kubelets_v1_one():
    service = podresources_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert [m.name for m in service.methods] == ["List"]
    fields = podresources_pb2.ContainerDevices.DESCRIPTOR.fields_by_name
    assert (fields["resource_name"].number, fields["device_ids"].number) == (1, 2)
