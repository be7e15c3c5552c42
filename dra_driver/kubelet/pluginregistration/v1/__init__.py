"""Plugin registration v1: the kubelet's plugin watcher calls GetInfo on a socket it finds in
its registry folder, then NotifyRegistrationStatus with the outcome."""

from typing import Final

from dra_driver.kubelet.pluginregistration.v1 import api_pb2, api_pb2_grpc

DRA_PLUGIN: Final = "DRAPlugin"
"""The plugin type the kubelet hands to its DRA plugin manager."""
REGISTRY_DIR: Final = "/var/lib/kubelet/plugins_registry"

__all__ = ["DRA_PLUGIN", "REGISTRY_DIR", "api_pb2", "api_pb2_grpc"]
