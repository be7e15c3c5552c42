"""A fake NVML that reports the GPUs a fleet file describes, with knobs for tests.

The local cluster's KWOK nodes and the device plugin read the same fleet file,
so the plugin discovers exactly the GPUs the scheduler sees. Tests and e2e then
steer it: memory and utilisation, memory that drifts over time, XID events and
ECC records (injected, or scheduled by the fleet's ``xidEvents`` and
``eccEvents``) and failing NVML calls. Its telemetry (power, heat, clocks,
links, processes) follows that load, as ``fake_telemetry`` models each board. A
GPU the fleet lists as ``unhealthy`` fails its live readings (memory,
utilisation, telemetry) the way a GPU that fell off the bus does, so discovery
and health checks find it through the same path as on real hardware.
"""

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Final, TypeVar

from infergrid.fleet import FAKE_ECC, FleetNode, ScheduledEcc, ScheduledXid
from infergrid.inventory import ECC_FIELDS, EccState, Gpu, GpuLink, MigInstance
from infergrid.nvml.backend import DeviceInfo, NvmlError, Telemetry, XidEvent
from infergrid.nvml.fake_telemetry import nvlink_bytes_per_second, reading

CALLS: Final = frozenset(
    {
        "device_count",
        "device_info",
        "mig_instances",
        "links",
        "memory_used_mib",
        "utilization_percent",
        "telemetry",
        "ecc_state",
        "wait_for_events",
    }
)
"""Backend calls that ``FakeNvml.fail`` can make raise."""

_NODE_CALLS: Final = frozenset({"device_count", "wait_for_events"})
"""Calls about the node, not one GPU: they fail for every GPU or not at all."""

LIVE_READINGS: Final = ("memory_used_mib", "utilization_percent", "telemetry")
"""The calls a GPU listed unhealthy fails: it still has an identity, but cannot be read."""

_LOST: Final = "GPU is lost (listed unhealthy in the fleet)"
_INJECTED: Final = "injected failure"

Scheduled = TypeVar("Scheduled", ScheduledXid, ScheduledEcc)


@dataclass(frozen=True, slots=True)
class _Drift:
    """Memory use that follows ``points`` (seconds after ``start``, MiB), linearly."""

    start: float
    points: tuple[tuple[float, int], ...]

    def at(self, now: float) -> int:
        return interpolate(self.points, now - self.start)


def interpolate(points: Sequence[tuple[float, int]], t: float) -> int:
    """The value at ``t`` on the line through ``points``; flat before the first and after."""
    if t <= points[0][0]:
        return points[0][1]
    for (t0, v0), (t1, v1) in pairwise(points):
        if t <= t1:
            return round(v0 + (v1 - v0) * (t - t0) / (t1 - t0))
    return points[-1][1]


class FakeNvml:
    """An ``NvmlBackend`` over one fleet node; thread-safe, one lock guards all state.

    Time comes from ``clock`` (seconds), so a test with a fake clock sees
    drifting memory move, NVLink byte counters grow at the rate the utilisation
    sets, and scheduled XIDs and ECC records come due; the fleet's
    ``xidEvents`` and ``eccEvents`` count from the moment the fake is made. Waiting
    for events uses real time, as NVML does.
    """

    def __init__(self, node: FleetNode, clock: Callable[[], float] = time.monotonic) -> None:
        self._node = node.name
        self._busy_percent = node.held_busy_percent
        self._gpus = {gpu.index: gpu for gpu in node.inventory.gpus}
        self._clock = clock
        self._lock = threading.Lock()
        self._event_queued = threading.Condition(self._lock)
        self._events: deque[XidEvent] = deque()
        self._scheduled = _schedule(node.xid_events, self._gpus, clock())
        self._ecc = {gpu.index: gpu.ecc or FAKE_ECC for gpu in node.inventory.gpus}
        self._scheduled_ecc = _in_due_order(node.ecc_events, clock())
        self._used: dict[int, int] = {}
        self._drifts: dict[int, _Drift] = {}
        self._utilization: dict[int, int] = {}
        self._nvlink_moved = {gpu.index: (clock(), 0.0) for gpu in node.inventory.gpus}
        """Per GPU: when its NVLink bytes were last counted, and the bytes counted by then."""
        self._failures: dict[tuple[str, int | None], str] = {
            (call, gpu.index): _LOST
            for gpu in node.inventory.gpus
            if not gpu.healthy
            for call in LIVE_READINGS
        }
        self._closed = False

    # The NvmlBackend calls.

    def device_count(self) -> int:
        with self._lock:
            self._check("device_count", None)
            return len(self._gpus)

    def device_info(self, index: int) -> DeviceInfo:
        with self._lock:
            gpu = self._read("device_info", index)
        return DeviceInfo(
            index=gpu.index,
            uuid=gpu.uuid,
            model=gpu.model,
            memory_mib=gpu.memory_mib,
            sm_count=gpu.sm_count,
            compute_capability=gpu.compute_capability,
            numa_node=gpu.numa_node,
            mig_enabled=gpu.mig_enabled,
        )

    def mig_instances(self, index: int) -> tuple[MigInstance, ...]:
        with self._lock:
            return self._read("mig_instances", index).mig_instances

    def links(self, index: int) -> tuple[GpuLink, ...]:
        with self._lock:
            return self._read("links", index).links

    def memory_used_mib(self, index: int) -> int:
        with self._lock:
            self._read("memory_used_mib", index)
            return self._used_now(index)

    def utilization_percent(self, index: int) -> int:
        with self._lock:
            self._read("utilization_percent", index)
            return self._utilization.get(index, 0)

    def telemetry(self, index: int) -> Telemetry:
        with self._lock:
            gpu = self._read("telemetry", index)
            moved = self._count_nvlink(index)
            return reading(gpu, self._used_now(index), self._utilization.get(index, 0), moved)

    def ecc_state(self, index: int) -> EccState:
        with self._lock:
            self._read("ecc_state", index)
            self._apply_due_ecc()
            return self._ecc[index]

    def wait_for_events(self, timeout_s: float) -> tuple[XidEvent, ...]:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._check("wait_for_events", None)
            while True:
                self._release_due()
                left = deadline - time.monotonic()
                if self._events or self._closed or left <= 0:
                    break
                self._event_queued.wait(min(left, self._until_next_due()))
            events = tuple(self._events)
            self._events.clear()
            return events

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._event_queued.notify_all()

    # Simulation controls.

    def set_memory_used(self, index: int, mib: int) -> None:
        """Memory in use from now on; ends any drift."""
        with self._lock:
            self._check_memory(index, mib)
            self._drifts.pop(index, None)
            self._used[index] = mib

    def drift_memory(self, index: int, points: Sequence[tuple[float, int]]) -> None:
        """Memory in use that moves linearly through ``points`` (seconds from now, MiB)."""
        if not points:
            raise ValueError("points: need at least one (seconds, MiB) point")
        times = [t for t, _ in points]
        if times != sorted(times) or len(set(times)) != len(times):
            raise ValueError(f"points: times must increase, got {times}")
        with self._lock:
            for _, mib in points:
                self._check_memory(index, mib)
            self._drifts[index] = _Drift(self._clock(), tuple(points))

    def set_utilization(self, index: int, percent: int) -> None:
        """Utilisation from now on, 0 to 100."""
        if not 0 <= percent <= 100:
            raise ValueError(f"percent: must be from 0 to 100, got {percent}")
        with self._lock:
            self._gpu(index)
            self._count_nvlink(index)  # the bytes moved at the old rate, up to now
            self._utilization[index] = percent

    def run(self, held: Mapping[str, float]) -> None:
        """The pods holding each GPU (by UUID, the fraction of it they hold) run on it: its
        utilisation becomes that fraction of the fleet's ``heldBusyPercent``, capped at 100,
        and a GPU no pod holds idles. Nothing happens when the fleet leaves it at 0."""
        if not self._busy_percent:
            return
        for index, gpu in self._gpus.items():
            ratio = held.get(gpu.uuid, 0.0)
            self.set_utilization(index, min(100, round(ratio * self._busy_percent)))

    def inject_xid(self, index: int, xid: int) -> None:
        """Queue an XID event for GPU ``index`` and wake a waiting ``wait_for_events``."""
        with self._lock:
            self._events.append(XidEvent(self._gpu(index).uuid, xid))
            self._event_queued.notify_all()

    def inject_ecc(self, index: int, **values: int | bool) -> None:
        """Set ECC values of GPU ``index`` by field: ``inject_ecc(0, remap_pending=True)``.

        Values not named keep what the GPU had; an unknown name is a TypeError (a test's bug).
        """
        with self._lock:
            self._gpu(index)
            self._ecc[index] = _with(self._ecc[index], EccState(**values))

    def fail(self, call: str, index: int | None = None) -> None:
        """Make ``call`` raise NvmlError, for GPU ``index`` or, when None, for every GPU."""
        with self._lock:
            self._check_call(call, index)
            self._failures[(call, index)] = _INJECTED

    def heal(self, call: str | None = None, index: int | None = None) -> None:
        """Lift failures, including a fleet's ``unhealthy``; None matches any call or GPU.

        ``heal(index=2)`` lifts failures set for GPU 2 only: a failure set for
        every GPU stays until healed with ``index`` None.
        """
        with self._lock:
            self._check_call(call, index)
            self._failures = {
                (c, i): reason
                for (c, i), reason in self._failures.items()
                if not ((call is None or c == call) and (index is None or i == index))
            }

    # Helpers; the lock is held.

    def _check(self, call: str, index: int | None) -> None:
        """Raise what NVML would: shut down, no such GPU, or a failure set by ``fail``."""
        if self._closed:
            raise NvmlError(call, index, "NVML is shut down")
        if index is not None and index not in self._gpus:
            raise NvmlError(call, index, f"no such GPU on {self._node}")
        reason = self._failures.get((call, index)) or self._failures.get((call, None))
        if reason:
            raise NvmlError(call, index, reason)

    def _read(self, call: str, index: int) -> Gpu:
        self._check(call, index)
        return self._gpus[index]

    def _used_now(self, index: int) -> int:
        drift = self._drifts.get(index)
        return drift.at(self._clock()) if drift else self._used.get(index, 0)

    def _count_nvlink(self, index: int) -> int | None:
        """Bytes GPU ``index`` moved over NVLink up to now, at its utilisation; None without any."""
        now = self._clock()
        since, moved = self._nvlink_moved[index]
        rate = nvlink_bytes_per_second(self._gpus[index], self._utilization.get(index, 0))
        if rate is None:
            return None
        moved += rate * max(now - since, 0.0)
        self._nvlink_moved[index] = (now, moved)
        return round(moved)

    def _gpu(self, index: int) -> Gpu:
        """The GPU a control names; a test naming a GPU the node lacks is a bug in the test."""
        if index not in self._gpus:
            raise ValueError(f"index: {self._node} has no GPU {index}")
        return self._gpus[index]

    def _release_due(self) -> None:
        """Queue every scheduled XID whose time has come, in time order."""
        now = self._clock()
        while self._scheduled and self._scheduled[0][0] <= now:
            self._events.append(self._scheduled.popleft()[1])

    def _apply_due_ecc(self) -> None:
        """Apply every scheduled ECC record whose time has come, in time order."""
        now = self._clock()
        while self._scheduled_ecc and self._scheduled_ecc[0][0] <= now:
            event = self._scheduled_ecc.popleft()[1]
            self._ecc[event.gpu] = _with(self._ecc[event.gpu], event.values)

    def _until_next_due(self) -> float:
        """Seconds on the clock until the next scheduled XID; infinite with none left."""
        return self._scheduled[0][0] - self._clock() if self._scheduled else math.inf

    def _check_memory(self, index: int, mib: int) -> None:
        total = self._gpu(index).memory_mib
        if not 0 <= mib <= total:
            raise ValueError(f"mib: GPU {index} has {total} MiB, got {mib}")

    def _check_call(self, call: str | None, index: int | None) -> None:
        if call is not None and call not in CALLS:
            raise ValueError(f"call: {call!r} is not one of {', '.join(sorted(CALLS))}")
        if call in _NODE_CALLS and index is not None:
            raise ValueError(f"index: {call} is not about one GPU; leave index None")
        if index is not None:
            self._gpu(index)


def _schedule(
    xids: Sequence[ScheduledXid], gpus: dict[int, Gpu], start: float
) -> deque[tuple[float, XidEvent]]:
    """(clock time due, event) per scheduled XID, earliest first."""
    return deque((due, XidEvent(gpus[x.gpu].uuid, x.xid)) for due, x in _in_due_order(xids, start))


def _in_due_order(events: Sequence[Scheduled], start: float) -> deque[tuple[float, Scheduled]]:
    """(clock time due, event) per event, earliest first; equal times keep file order."""
    timed = sorted(((start + e.after_s, n), e) for n, e in enumerate(events))
    return deque((due, e) for (due, _), e in timed)


def _with(ecc: EccState, values: EccState) -> EccState:
    """``ecc`` with each value that ``values`` sets (is not None)."""
    changed = {name: getattr(values, name) for _, name, _ in ECC_FIELDS}
    return replace(ecc, **{name: value for name, value in changed.items() if value is not None})
