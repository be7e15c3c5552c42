"""The kubelet's PodResources API, v1: which devices each running container holds.

`v1/api.proto` is the List call of k8s.io/kubelet pkg/apis/podresources/v1 with
its field numbers unchanged; its `api_pb2*` stubs are generated like the device
plugin API's (`make protos`) and a test fails if they drift.
"""

from device_plugin.kubelet.podresources.v1 import api_pb2, api_pb2_grpc

POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

__all__ = ["POD_RESOURCES_SOCKET", "api_pb2", "api_pb2_grpc"]
