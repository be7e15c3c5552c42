"""A kubelet stand-in for tests and benchmarks: a real Registration server on a unix socket.

It records what plugins register and dials their sockets with the real
DevicePlugin stub, exactly as the kubelet would.
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc

from device_plugin.kubelet import KUBELET_SOCKET, api_pb2, api_pb2_grpc


class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    def __init__(self, plugin_dir: Path):
        self.plugin_dir = plugin_dir
        self.socket = plugin_dir / KUBELET_SOCKET
        self.registrations: list[api_pb2.RegisterRequest] = []
        self.changed = threading.Condition()
        self._server: grpc.Server | None = None
        self._channels: list[grpc.Channel] = []

    def Register(self, request, context):
        with self.changed:
            self.registrations.append(request)
            self.changed.notify_all()
        return api_pb2.Empty()

    def start(self) -> None:
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def stop(self) -> None:
        for channel in self._channels:
            channel.close()
        self._channels = []
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)

    def restart(self) -> None:
        """What a kubelet restart does: the folder is wiped and kubelet.sock recreated."""
        self.stop()
        for sock in self.plugin_dir.glob("*.sock"):
            sock.unlink()
        self.start()

    def wait_registered(self, resources: set[str], since: int = 0, timeout: float = 10) -> bool:
        def done() -> bool:
            return resources <= {r.resource_name for r in self.registrations[since:]}

        with self.changed:
            return self.changed.wait_for(done, timeout)

    def endpoint(self, resource: str) -> str:
        latest = [r for r in self.registrations if r.resource_name == resource][-1]
        return latest.endpoint

    def plugin(self, resource: str) -> api_pb2_grpc.DevicePluginStub:
        channel = grpc.insecure_channel(f"unix://{self.plugin_dir / self.endpoint(resource)}")
        self._channels.append(channel)
        return api_pb2_grpc.DevicePluginStub(channel)
