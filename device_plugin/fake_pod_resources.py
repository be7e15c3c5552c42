"""A PodResources stand-in for tests: a real PodResourcesLister server on a unix socket.

A test sets what each container holds, as the kubelet records it after its
Allocate call returned; `stop` makes the socket unreachable, as a kubelet that
does not answer.
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc

from device_plugin.holdings import Held
from device_plugin.kubelet.podresources import api_pb2, api_pb2_grpc


class FakePodResources(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, socket: Path):
        self.socket = socket
        self.held: list[Held] = []
        self.calls = 0
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    def hold(self, namespace: str, pod: str, container: str, resource: str, *ids: str) -> None:
        """Records that a container holds `ids` of `resource`, as the kubelet would."""
        with self._lock:
            self.held.append(Held(namespace, pod, container, resource, frozenset(ids)))

    def admit(self, namespace: str, pod: str, container: str) -> None:
        """The kubelet starts admitting the pod: it lists the container, holding nothing yet."""
        self.hold(namespace, pod, container, "")

    def release(self, namespace: str, pod: str) -> None:
        """The pod's containers ended: the kubelet lists them no more."""
        with self._lock:
            self.held = [h for h in self.held if (h.namespace, h.pod) != (namespace, pod)]

    def List(self, request, context):
        with self._lock:
            self.calls += 1
            pods: dict[tuple[str, str], api_pb2.PodResources] = {}
            for h in self.held:
                pod = pods.setdefault(
                    (h.namespace, h.pod), api_pb2.PodResources(name=h.pod, namespace=h.namespace)
                )
                devices = [
                    api_pb2.ContainerDevices(resource_name=h.resource, device_ids=sorted(h.devices))
                ]
                pod.containers.append(
                    api_pb2.ContainerResources(
                        name=h.container, devices=devices if h.resource else []
                    )
                )
            return api_pb2.ListPodResourcesResponse(pod_resources=list(pods.values()))

    def start(self) -> None:
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)
