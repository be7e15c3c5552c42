"""One resource's gRPC server on its own unix socket, and its registration.

Start order never changes: fresh socket, serve, dial it to prove it is up,
then Register with the kubelet. Stop removes the socket.
"""

from __future__ import annotations

import logging
import os
from concurrent import futures
from pathlib import Path

import grpc

from device_plugin import metrics
from device_plugin.kubelet import API_VERSION, KUBELET_SOCKET, api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

DIAL_TIMEOUT_S = 5.0


def socket_name(resource: str) -> str:
    """`nvidia.com/mig-1g.10gb` -> `infergrid-nvidia.com-mig-1g.10gb.sock`."""
    return "infergrid-" + resource.replace("/", "-") + ".sock"


class PluginEndpoint:
    def __init__(
        self,
        resource: str,
        servicer: api_pb2_grpc.DevicePluginServicer,
        plugin_dir: Path,
        max_streams: int = 8,
    ):
        self.resource = resource
        self.servicer = servicer
        self.plugin_dir = plugin_dir
        self.socket = plugin_dir / socket_name(resource)
        self.max_streams = max_streams
        self._server: grpc.Server | None = None

    def start(self) -> None:
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.max_streams + 8))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        with grpc.insecure_channel(f"unix://{self.socket}") as channel:
            grpc.channel_ready_future(channel).result(timeout=DIAL_TIMEOUT_S)

    def register(self) -> None:
        """Tells the kubelet about this resource; raises grpc.RpcError if it refuses."""
        kubelet = self.plugin_dir / KUBELET_SOCKET
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket.name,
            resource_name=self.resource,
            options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
        )
        try:
            with grpc.insecure_channel(f"unix://{kubelet}") as channel:
                api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=DIAL_TIMEOUT_S)
        except grpc.RpcError:
            metrics.REGISTRATIONS.labels(self.resource, "failed").inc()
            raise
        metrics.REGISTRATIONS.labels(self.resource, "ok").inc()
        log.info("registered %s at %s", self.resource, self.socket)

    def stop(self, grace: float = 1.0) -> None:
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)

    @property
    def serving(self) -> bool:
        return self._server is not None and self.socket.exists()


def socket_identity(path: Path) -> tuple[int, int] | None:
    """(inode, ctime) of a socket file, or None: a recreated socket has a new identity."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)
