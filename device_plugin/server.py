"""The kubelet-facing gRPC servicer, one per resource name.

Thin: it turns protobuf into plain values, asks the DeviceManager, and turns
the answer back. ListAndWatch re-sends the whole list after every change, and
wakes on a health change rather than polling slowly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from device_plugin import metrics
from device_plugin.allocator import AllocationError, Grant
from device_plugin.devices import Device
from device_plugin.kubelet import HEALTHY, UNHEALTHY, api_pb2, api_pb2_grpc
from device_plugin.manager import DeviceManager

log = logging.getLogger(__name__)

WaitForChange = Callable[[int, float], int]
"""(last seen version, timeout seconds) -> current version; returns early on a change."""


MAX_STATUS_MESSAGE_BYTES = 2048
"""A gRPC client drops a call whose trailers pass its metadata limit (8 KiB soft, 16 KiB hard,
after percent-encoding, which can triple non-ASCII bytes) and reports RESOURCE_EXHAUSTED in
place of the reason: a refusal naming thousands of device IDs reached the kubelet as
"received metadata size exceeds hard limit". Cut, the reason arrives."""


def status_message(reason: str) -> str:
    """`reason`, cut to what a gRPC status carries to every client, saying how much was cut."""
    data = reason.encode("utf-8", "surrogatepass")
    if len(data) <= MAX_STATUS_MESSAGE_BYTES:
        return reason
    kept = data[: MAX_STATUS_MESSAGE_BYTES - 64].decode("utf-8", "ignore")
    return f"{kept}... ({len(reason) - len(kept)} more characters)"


def _device_pb(device: Device) -> api_pb2.Device:
    return api_pb2.Device(
        ID=device.id,
        health=HEALTHY if device.healthy else UNHEALTHY,
        topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=device.gpu.numa_node)]),
    )


def _response(grant: Grant) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=grant.envs,
        cdi_devices=[api_pb2.CDIDevice(name=n) for n in grant.cdi_devices],
        mounts=[
            api_pb2.Mount(
                container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
            )
            for m in grant.mounts
        ],
    )


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(
        self,
        resource: str,
        manager: DeviceManager,
        wait_for_change: WaitForChange,
        stop: threading.Event,
        on_grants: Callable[[list[Grant]], None] = lambda grants: None,
        wake_interval: float = 0.5,
    ):
        self.resource = resource
        self.manager = manager
        self.wait_for_change = wait_for_change
        self.stop = stop
        self.on_grants = on_grants
        self.wake_interval = wake_interval

    def GetDevicePluginOptions(self, request, context):
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request, context) -> Iterator[api_pb2.ListAndWatchResponse]:
        last: list[tuple[str, bool]] | None = None
        version = 0
        while context.is_active() and not self.stop.is_set():
            devices = self.manager.devices(self.resource)
            current = [(d.id, d.healthy) for d in devices]
            if current != last:
                last = current
                metrics.LIST_AND_WATCH_SENDS.labels(self.resource).inc()
                yield api_pb2.ListAndWatchResponse(devices=[_device_pb(d) for d in devices])
            version = self.wait_for_change(version, self.wake_interval)

    def GetPreferredAllocation(self, request, context):
        asked = [
            (list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size)
            for r in request.container_requests
        ]
        try:
            chosen = self.manager.preferred_each(self.resource, asked)
        except AllocationError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, status_message(str(err)))
        return api_pb2.PreferredAllocationResponse(
            container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids) for ids in chosen
            ]
        )

    def Allocate(self, request, context):
        started = time.perf_counter()
        requests = [list(r.devices_ids) for r in request.container_requests]
        try:
            grants = self.manager.allocate(self.resource, requests)
        except AllocationError as err:
            metrics.ALLOCATIONS.labels(self.resource, "refused").inc()
            message = status_message(str(err))
            asked = status_message(repr(requests))
            log.warning("refused Allocate for %s %s: %s", self.resource, asked, message)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)
        self.on_grants(grants)
        metrics.ALLOCATIONS.labels(self.resource, "granted").inc()
        metrics.ALLOCATE_SECONDS.labels(self.resource).observe(time.perf_counter() - started)
        return api_pb2.AllocateResponse(container_responses=[_response(g) for g in grants])

    def PreStartContainer(self, request, context):
        return api_pb2.PreStartContainerResponse()
