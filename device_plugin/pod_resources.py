"""Reads the kubelet's PodResources API: which devices each running container holds.

Every call has a deadline and never raises: the plugin falls back to what it
knew before when the kubelet does not answer, and says so, rather than stop
granting or crash.
"""

from __future__ import annotations

import logging
from typing import Final

import grpc

from device_plugin import metrics
from device_plugin.holdings import Held
from device_plugin.kubelet.podresources import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

LIST_TIMEOUT_S: Final = 2.0
"""Seconds to wait for List: it runs while the kubelet waits for Allocate."""


def holdings(response: api_pb2.ListPodResourcesResponse) -> list[Held]:
    """A List answer as plain data, one entry per container and resource, and one with no
    resource for a container that holds no devices: the kubelet lists a pod from the moment
    it starts admitting it, before any Allocate returned."""
    return [
        Held(pod.namespace, pod.name, container.name, devices.resource_name,
             frozenset(devices.device_ids))
        for pod in response.pod_resources
        for container in pod.containers
        for devices in container.devices or [api_pb2.ContainerDevices()]
    ]  # fmt: skip


class PodResourcesClient:
    """The kubelet's PodResources socket, dialled once and asked at each `list`."""

    def __init__(self, socket: str, timeout_s: float = LIST_TIMEOUT_S):
        self.socket = socket
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        self.last_error = ""

    def list(self) -> list[Held] | None:
        """What every running container holds, or None (logged, counted) when no answer comes."""
        try:
            reply = self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as err:
            self.last_error = f"{err.code().name}: {err.details()}"  # type: ignore[attr-defined]
            metrics.POD_RESOURCES_ERRORS.inc()
            log.warning("the kubelet's PodResources API at %s did not answer (%s)",
                        self.socket, self.last_error)  # fmt: skip
            return None
        self.last_error = ""
        return holdings(reply)

    def describe(self) -> str:
        """Names the socket and its last failure, for warnings and refusals."""
        return f"the kubelet's PodResources API at {self.socket} did not answer ({self.last_error})"

    def close(self) -> None:
        self._channel.close()
