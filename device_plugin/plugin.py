"""All of one node's plugin endpoints, kept registered across kubelet restarts.

The kubelet wipes its device-plugin folder and recreates `kubelet.sock` when
it restarts; the plugin then serves fresh sockets and registers again. The
folder is polled every `poll_s`, so re-registration takes well under 5 s.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc

from device_plugin.endpoint import PluginEndpoint, socket_identity
from device_plugin.kubelet import KUBELET_SOCKET

log = logging.getLogger(__name__)


class NodePlugins:
    def __init__(
        self,
        make_endpoints: Callable[[], list[PluginEndpoint]],
        plugin_dir,
        stop: threading.Event,
        poll_s: float = 0.5,
    ):
        self.make_endpoints = make_endpoints
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET
        self.stop = stop
        self.poll_s = poll_s
        self.endpoints: list[PluginEndpoint] = []
        self.registered = threading.Event()
        self._kubelet_identity: tuple[int, int] | None = None

    def restart(self) -> bool:
        """Serves every resource afresh and registers each; True when all registered."""
        self.shutdown()
        self.registered.clear()
        self._kubelet_identity = socket_identity(self.kubelet_socket)
        if self._kubelet_identity is None:
            return False
        self.endpoints = self.make_endpoints()
        try:
            for endpoint in self.endpoints:
                endpoint.start()
                endpoint.register()
        except grpc.RpcError as err:
            log.warning("registration with the kubelet failed, will retry: %s", err)
            return False
        self.registered.set()
        return True

    def _needs_restart(self) -> bool:
        identity = socket_identity(self.kubelet_socket)
        if identity is None:
            return False
        lost_socket = any(not e.serving for e in self.endpoints)
        return identity != self._kubelet_identity or lost_socket or not self.registered.is_set()

    def run(self) -> None:
        """Registers, then watches for kubelet restarts until `stop` is set."""
        self.restart()
        while not self.stop.wait(self.poll_s):
            if self._needs_restart():
                log.info("kubelet socket changed; serving and registering again")
                self.restart()
        self.shutdown()

    def shutdown(self) -> None:
        for endpoint in self.endpoints:
            endpoint.stop()
        self.endpoints = []
