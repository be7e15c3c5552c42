"""GPU health: which GPUs may be offered now, and a way to wait until that changes.

A critical XID, a failed NVML call or an ECC record that ``device_plugin.ecc``
finds at fault makes a GPU unhealthy. Unlike NVIDIA's device plugin, where a GPU
never comes back, ours is healthy again once ``quiet_period_s`` has passed with
no new bad event, so a transient fault does not take a GPU out until the node
reboots. An XID that needs a GPU reset (``device_plugin.xid``: double-bit ECC, a
GPU off the bus, ...) is not transient, nor is an ECC record that needs one: the
GPU stays unhealthy however quiet it stays, until the plugin restarts. The
restart is how a reset is seen: NVML reports no reset to a process that keeps
running, and a reset (``nvidia-smi -r``) is done with the GPU's clients stopped
anyway, so the procedure is drain, reset, restart the plugin's pod. A plugin
that restarts without a reset forgets the XID, as NVIDIA's does, but not a
double-bit error: the volatile ECC count keeps it until the reset. ListAndWatch
waits on ``wait_for_change`` and re-sends the device list when the version moves.
"""

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from device_plugin import metrics
from device_plugin.ecc import ecc_fault
from device_plugin.xid import XidKind, classify_xid, describe_xid
from infergrid.inventory import EccState
from infergrid.nvml.backend import NvmlBackend, NvmlError

log = logging.getLogger(__name__)

DEFAULT_PROBE_INTERVAL_S: Final = 0.5


@dataclass(frozen=True, slots=True)
class _Fault:
    """Why a GPU is unhealthy, and the clock time it recovers unless something new goes wrong.

    ``until`` is infinite for a GPU that needs a reset: it never recovers in this process.
    """

    reason: str
    until: float

    @property
    def needs_reset(self) -> bool:
        return self.until == math.inf


class HealthTracker:
    """The health of each GPU by uuid, with a version that moves on every flip.

    The version moves when a GPU turns unhealthy and when it recovers, not when
    a GPU that is already unhealthy gets another bad event (which only pushes
    its recovery back, or cancels it for an XID that needs a reset). A GPU that
    needs a reset keeps its first such reason whatever comes after. Thread-safe.
    """

    def __init__(self, quiet_period_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if quiet_period_s < 0:
            raise ValueError(f"quiet_period_s: must be at least 0, got {quiet_period_s}")
        self._quiet_period_s = quiet_period_s
        self._clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._faults: dict[str, _Fault] = {}
        self._first_ecc: dict[str, EccState] = {}
        self._version = 0

    @property
    def version(self) -> int:
        """The current version; pass it to ``wait_for_change``."""
        with self._lock:
            self._expire()
            return self._version

    def record_xid(self, uuid: str, xid: int) -> None:
        """A critical XID on GPU ``uuid``, handled as ``classify_xid`` says."""
        kind = classify_xid(xid)
        if kind is XidKind.APPLICATION:
            log.info("GPU %s: XID %d is an application error; GPU stays healthy", uuid, xid)
        elif kind is XidKind.NEEDS_RESET:
            self._mark(uuid, f"{describe_xid(xid)}: needs a GPU reset", math.inf)
        else:
            self._mark(uuid, describe_xid(xid), self._clock() + self._quiet_period_s)

    def record_failure(self, uuid: str, reason: str) -> None:
        """An NVML call on GPU ``uuid`` failed: a transient fault, renewed while it lasts."""
        self._mark(uuid, reason, self._clock() + self._quiet_period_s)

    def record_ecc(self, uuid: str, ecc: EccState) -> None:
        """GPU ``uuid``'s ECC record now, judged by ``ecc_fault`` against the first one seen.

        A record that needs a reset holds the GPU as an XID that needs one does.
        Growth of a kept count is a fault renewed at each reading while the count
        stays above the first reading: until the plugin restarts, or someone
        clears the counts (``nvidia-smi -p``), and then the quiet period.
        """
        with self._lock:
            first = self._first_ecc.setdefault(uuid, ecc)
        fault = ecc_fault(first, ecc)
        if fault is None:
            return
        if fault.needs_reset:
            new = self._mark(uuid, f"{fault.reason}: needs a GPU reset", math.inf)
        else:
            new = self._mark(uuid, fault.reason, self._clock() + self._quiet_period_s)
        if new:
            metrics.ECC_FAULTS.labels("needs-reset" if fault.needs_reset else "grew").inc()

    def is_healthy(self, uuid: str) -> bool:
        """Whether GPU ``uuid`` may be offered; a GPU never seen is healthy."""
        with self._lock:
            self._expire()
            return uuid not in self._faults

    def unhealthy(self) -> dict[str, str]:
        """The reason each unhealthy GPU is unhealthy, by uuid."""
        with self._lock:
            self._expire()
            return {uuid: fault.reason for uuid, fault in self._faults.items()}

    def wait_for_change(self, since_version: int, timeout: float) -> int:
        """The version once it differs from ``since_version``, or after ``timeout`` seconds.

        Wakes at once on a new fault and at the next recovery deadline, never
        by polling. ``timeout`` is real seconds; deadlines are on the tracker's clock.
        """
        end = time.monotonic() + timeout
        with self._lock:
            while True:
                self._expire()
                left = end - time.monotonic()
                if self._version != since_version or left <= 0:
                    return self._version
                self._changed.wait(min(left, self._until_next_recovery()))

    def _mark(self, uuid: str, reason: str, until: float) -> bool:
        """Record a fault; True when it turned the GPU unhealthy or made it need a reset."""
        with self._lock:
            self._expire()
            known = self._faults.get(uuid)
            if known is not None and known.needs_reset:
                return False
            if until == math.inf:
                log.error(
                    "GPU %s is unhealthy until it is reset and this plugin restarted: %s",
                    uuid,
                    reason,
                )
            elif known is None:
                log.warning("GPU %s is unhealthy: %s", uuid, reason)
            if known is None:
                self._bump()
            self._faults[uuid] = _Fault(reason, until)
            return known is None or until == math.inf

    def _expire(self) -> None:
        """Bring back every GPU whose quiet period has passed; the lock is held."""
        now = self._clock()
        recovered = [uuid for uuid, fault in self._faults.items() if fault.until <= now]
        for uuid in recovered:
            log.info(
                "GPU %s is healthy again after %s s without faults", uuid, self._quiet_period_s
            )
            del self._faults[uuid]
        if recovered:
            self._bump()

    def _until_next_recovery(self) -> float:
        deadlines = [fault.until for fault in self._faults.values()]
        return min(deadlines) - self._clock() if deadlines else math.inf

    def _bump(self) -> None:
        self._version += 1
        self._changed.notify_all()


class HealthMonitor:
    """Feeds a HealthTracker from a backend, in a thread of its own until ``stop_event`` is set.

    Each round waits up to ``interval_s`` for XID events, then probes every GPU
    by reading its memory use; a failed read marks that GPU unhealthy. A GPU
    that keeps failing is marked again every round, so it stays unhealthy as
    long as ``interval_s`` is shorter than the tracker's quiet period.
    """

    def __init__(
        self,
        backend: NvmlBackend,
        tracker: HealthTracker,
        stop_event: threading.Event,
        interval_s: float = DEFAULT_PROBE_INTERVAL_S,
    ) -> None:
        self._backend = backend
        self._tracker = tracker
        self._stop = stop_event
        self._interval_s = interval_s
        self._uuids: dict[int, str] = {}

    def run(self) -> None:
        """Rounds until stopped; returns within about one interval of ``stop_event``."""
        while not self._stop.is_set():
            try:
                self.check_once()
            except Exception:
                log.exception("GPU health round failed; the next round runs as usual")
                self._stop.wait(self._interval_s)

    def check_once(self) -> None:
        """One round: XID events for up to one interval, then a probe of every GPU."""
        self._record_events()
        self._probe_all()

    def _record_events(self) -> None:
        try:
            events = self._backend.wait_for_events(self._interval_s)
        except NvmlError as error:
            log.warning("cannot read XID events: %s", error)
            self._stop.wait(self._interval_s)  # a call that fails at once must not spin the loop
            return
        for event in events:
            self._tracker.record_xid(event.uuid, event.xid)

    def _probe_all(self) -> None:
        try:
            count = self._backend.device_count()
        except NvmlError as error:
            log.warning("cannot count GPUs: %s", error)
            return
        for index in range(count):
            self._probe(index)

    def _probe(self, index: int) -> None:
        """Read GPU ``index``'s memory use; its uuid is read once and kept for later failures."""
        uuid = self._uuids.get(index)
        try:
            if uuid is None:
                uuid = self._backend.device_info(index).uuid
                self._uuids[index] = uuid
            self._backend.memory_used_mib(index)
        except NvmlError as error:
            if uuid is None:
                log.warning("GPU %d cannot be identified: %s", index, error)
            else:
                self._tracker.record_failure(uuid, str(error))
