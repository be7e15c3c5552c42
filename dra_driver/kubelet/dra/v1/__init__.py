"""DRA v1: NodePrepareResources and NodeUnprepareResources, served on the driver's endpoint."""

from typing import Final

from dra_driver.kubelet.dra.v1 import api_pb2, api_pb2_grpc

SERVICE: Final = "v1.DRAPlugin"
"""What the kubelet reads in GetInfo's supported_versions: the gRPC services the plugin serves,
by the names of k8s.io/kubelet's dra/v1 DRAPluginService (1.35 ignores plain versions)."""

__all__ = ["SERVICE", "api_pb2", "api_pb2_grpc"]
