"""The committed gRPC stubs are exactly what grpcio-tools makes from the official proto."""

from device_plugin.kubelet import api_pb2
from device_plugin.kubelet.codegen import OUTPUTS, PROTOS, ROOT, generate_into
from device_plugin.kubelet.podresources import api_pb2 as podresources_pb2
from dra_driver.kubelet.dra.v1 import SERVICE
from dra_driver.kubelet.dra.v1 import api_pb2 as dra_pb2
from dra_driver.kubelet.pluginregistration.v1 import api_pb2 as registration_pb2


def test_generated_stubs_match_the_proto(tmp_path):
    fresh_files = generate_into(tmp_path)
    for fresh in fresh_files:
        committed = ROOT / fresh.relative_to(tmp_path)
        assert committed.read_text() == fresh.read_text(), f"{committed} is stale: make protos"
    assert len(fresh_files) == len(OUTPUTS) * len(PROTOS) == 12


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


def test_the_dra_service_is_the_kubelets_v1_one_by_the_name_it_registers():
    service = dra_pb2.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert service.full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
    assert SERVICE == "v1.DRAPlugin"  # k8s.io/kubelet dra/v1 DRAPluginService
    fields = dra_pb2.Device.DESCRIPTOR.fields_by_name
    assert (fields["cdi_device_ids"].number, fields["share_id"].number) == (4, 5)


def test_the_registration_service_is_the_plugin_watchers():
    service = registration_pb2.DESCRIPTOR.services_by_name["Registration"]
    assert service.full_name == "pluginregistration.Registration"
    assert [m.name for m in service.methods] == ["GetInfo", "NotifyRegistrationStatus"]
