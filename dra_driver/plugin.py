"""The kubelet-facing gRPC: registration on the registry socket, DRA on the plugin socket.

Thin servicers: protobuf in, ClaimPreparer, protobuf out. Every claim gets an answer of its
own, an error string where it failed, so one bad claim never fails a call that carries
others and nothing a request holds can raise out of a servicer.
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from functools import partial
from pathlib import Path
from typing import Final

import grpc

from dra_driver.checkpoint import PreparedClaim
from dra_driver.claims import ClaimPreparer
from dra_driver.kubelet.dra.v1 import SERVICE, api_pb2, api_pb2_grpc
from dra_driver.kubelet.pluginregistration.v1 import DRA_PLUGIN
from dra_driver.kubelet.pluginregistration.v1 import api_pb2 as reg_pb2
from dra_driver.kubelet.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from dra_driver.prepare import ClaimRef, PrepareError
from infergrid import dra

log = logging.getLogger(__name__)

DRA_SOCKET: Final = "dra.sock"
REGISTRATION_SOCKET: Final = f"{dra.DRIVER}-reg.sock"
MAX_ERROR_CHARS: Final = 1024
"""A claim's error reaches the pod's events; a page of text says everything that matters."""


class RegistrationServicer(reg_grpc.RegistrationServicer):
    """What the kubelet's plugin watcher asks: who this is, then whether it was accepted."""

    def __init__(self, endpoint: Path) -> None:
        self.endpoint = endpoint
        self.registered = threading.Event()

    def GetInfo(self, request, context):  # noqa: N802 - the gRPC method name
        return reg_pb2.PluginInfo(
            type=DRA_PLUGIN,
            name=dra.DRIVER,
            endpoint=str(self.endpoint),
            supported_versions=[SERVICE],
        )

    def NotifyRegistrationStatus(self, request, context):  # noqa: N802
        if request.plugin_registered:
            log.info("the kubelet registered DRA driver %s at %s", dra.DRIVER, self.endpoint)
            self.registered.set()
        else:
            self.registered.clear()
            log.error(
                "THE KUBELET REFUSED DRA driver %s at %s: %s; no claim of it can be prepared "
                "on this node until it registers",
                dra.DRIVER,
                self.endpoint,
                request.error or "no reason given",
            )
        return reg_pb2.RegistrationStatusResponse()


class DraServicer(api_pb2_grpc.DRAPluginServicer):
    def __init__(self, preparer: ClaimPreparer) -> None:
        self.preparer = preparer

    def NodePrepareResources(self, request, context):  # noqa: N802
        response = api_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            if claim.uid not in response.claims:
                response.claims[claim.uid].CopyFrom(self._prepare(claim))
        return response

    def NodeUnprepareResources(self, request, context):  # noqa: N802
        response = api_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].CopyFrom(self._unprepare(claim))
        return response

    def _prepare(self, claim) -> api_pb2.NodePrepareResourceResponse:
        ref = ClaimRef(claim.namespace, claim.uid, claim.name)
        try:
            return _answer(self.preparer.prepare(ref))
        except PrepareError as err:
            log.warning("cannot prepare %s", err)
            return api_pb2.NodePrepareResourceResponse(error=_error(str(err)))
        except Exception as err:  # a fault of the node (disk, checkpoint): this claim fails
            log.exception("preparing %s failed", ref)
            return api_pb2.NodePrepareResourceResponse(error=_error(f"{ref}: {err}"))

    def _unprepare(self, claim) -> api_pb2.NodeUnprepareResourceResponse:
        try:
            self.preparer.unprepare(claim.uid)
            return api_pb2.NodeUnprepareResourceResponse()
        except Exception as err:
            log.exception("unpreparing claim %r failed", claim.uid)
            return api_pb2.NodeUnprepareResourceResponse(error=_error(f"{claim.uid!r}: {err}"))


def _answer(claim: PreparedClaim) -> api_pb2.NodePrepareResourceResponse:
    return api_pb2.NodePrepareResourceResponse(
        devices=[
            api_pb2.Device(
                request_names=d.request_names,
                pool_name=d.pool,
                device_name=d.device,
                cdi_device_ids=d.cdi_ids,
                share_id=d.share_id,
            )
            for d in claim.devices
        ]
    )


def _error(message: str) -> str:
    """A message the wire can carry: cut, and any character UTF-8 cannot hold escaped."""
    cut = message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + "..."
    return cut.encode("utf-8", "backslashreplace").decode("utf-8")


def serve(socket: Path, add_servicer, workers: int = 4) -> grpc.Server:
    """A started gRPC server on the unix socket ``socket``, a stale file there removed."""
    socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    add_servicer(server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    return server


class KubeletPlugin:
    """The DRA socket, then the registration socket: the kubelet finds the second only once
    the endpoint it names answers. ``stop`` closes both and removes their files."""

    def __init__(self, preparer: ClaimPreparer, plugin_dir: Path, registry_dir: Path) -> None:
        self.dra_socket = plugin_dir / DRA_SOCKET
        self.registration_socket = registry_dir / REGISTRATION_SOCKET
        self.registration = RegistrationServicer(self.dra_socket)
        self.dra = DraServicer(preparer)
        self._servers: list[grpc.Server] = []

    def start(self) -> None:
        add_dra = partial(api_pb2_grpc.add_DRAPluginServicer_to_server, self.dra)
        add_registration = partial(reg_grpc.add_RegistrationServicer_to_server, self.registration)
        self._servers.append(serve(self.dra_socket, add_dra))
        self._servers.append(serve(self.registration_socket, add_registration))
        log.info("serving %s, registering at %s", self.dra_socket, self.registration_socket)

    @property
    def serving(self) -> bool:
        return bool(self._servers)

    def stop(self, grace_s: float = 2.0) -> None:
        for server in reversed(self._servers):
            server.stop(grace_s).wait()
        self._servers.clear()
        self.registration_socket.unlink(missing_ok=True)
        self.dra_socket.unlink(missing_ok=True)
