"""The plugin's watch on the MPS control daemons: a daemon that does not answer is a GPU fault.

With MPS on, a share is enforced only while its GPU's control daemon runs: a
holder whose daemon is gone runs unlimited, or not at all. So every round the
watch asks each share GPU's daemon for its server list through the control
program, as a share holder's CUDA reaches it (the pipe folder), and a daemon that
is missing, fails or does not answer within the timeout (a stuck one) is
recorded in the HealthTracker as a fault of its GPU, the path an XID or an ECC
fault takes: the GPU is withdrawn from ListAndWatch and its holders get
GPUHealthy=False, which the operator acts on. A daemon that answers under a new
pid (its pid file) was restarted between two rounds: its clients lost their
server, so that is a fault too. The GPU is healthy again a quiet period after
its daemon last failed.

The control socket and pid file alone do not tell: a killed daemon leaves both
behind, and its pid is in another container's PID namespace. NVIDIA's plugin
probes the same way, once, before it registers; here the probe runs every round.
At start the plugin waits (``wait_ready``) for the daemons, which start beside it,
so a GPU whose daemon is only slow to start is not held out for a quiet period.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from device_plugin import metrics
from device_plugin.health import HealthTracker
from device_plugin.mps_control import TIMEOUT_S, probe_daemon, read_pid
from infergrid.inventory import Gpu
from infergrid.share_edits import gpu_paths

log = logging.getLogger(__name__)

PROBE_INTERVAL_S: Final = 2.0
START_TIMEOUT_S: Final = 30.0
"""How long the plugin waits at start for the daemons before it registers without them."""
_READY_POLL_S: Final = 0.2


@dataclass(frozen=True, slots=True)
class Probe:
    """One daemon's answer: its pid, or why it is at fault."""

    pid: int | None
    fault: str | None


class MpsWatch:
    """Probes the control daemon of each GPU ``gpus()`` returns, in a thread until ``stop``."""

    def __init__(
        self,
        control: str,
        root: Path,
        gpus: Callable[[], Sequence[Gpu]],
        tracker: HealthTracker,
        stop: threading.Event,
        interval_s: float = PROBE_INTERVAL_S,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self._control = control
        self._root = root
        self._gpus = gpus
        self._tracker = tracker
        self._stop = stop
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._pids: dict[str, int] = {}
        self._up: dict[str, bool] = {}

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until every daemon answers, or ``timeout_s``; then a round records what is wrong."""
        deadline = time.monotonic() + timeout_s
        log.info("waiting up to %g s for the MPS control daemons under %s", timeout_s, self._root)
        while time.monotonic() < deadline and not self._stop.is_set():
            if all(p.fault is None for p in self._probe_all().values()):
                break
            self._stop.wait(_READY_POLL_S)
        self.check_once()

    def run(self) -> None:
        """Rounds every ``interval_s`` until stopped."""
        while not self._stop.wait(self._interval_s):
            try:
                self.check_once()
            except Exception:
                log.exception(
                    "probing the MPS control daemons failed; the next round runs as usual"
                )

    def check_once(self) -> None:
        """One round: probe every daemon, and record each fault in the tracker."""
        for uuid, probe in self._probe_all().items():
            self._judge(uuid, probe)

    def _probe_all(self) -> dict[str, Probe]:
        """Every daemon's probe, all at once, so stuck daemons cost one timeout, not one each."""
        uuids = [gpu.uuid for gpu in self._gpus()]
        if not uuids:
            return {}
        with ThreadPoolExecutor(len(uuids), thread_name_prefix="mps-probe") as pool:
            return dict(zip(uuids, pool.map(self._probe, uuids), strict=True))

    def _probe(self, uuid: str) -> Probe:
        paths = gpu_paths(self._root, uuid)
        if not paths.control_socket.exists():
            return Probe(None, f"no MPS control daemon: {paths.control_socket} does not exist")
        silent = probe_daemon(self._control, paths, self._timeout_s)
        if silent is not None:
            return Probe(None, f"its MPS control daemon does not answer: {silent}")
        return Probe(read_pid(paths), None)

    def _judge(self, uuid: str, probe: Probe) -> None:
        fault, known = probe.fault, self._pids.get(uuid)
        if fault is None and None not in (known, probe.pid) and known != probe.pid:
            fault = (
                f"its MPS control daemon restarted (pid {known}, now {probe.pid}), "
                "so its clients lost their server"
            )
            metrics.MPS_DAEMON_RESTARTS.labels(uuid).inc()
        if probe.pid is not None:
            self._pids[uuid] = probe.pid
        up, was = fault is None, self._up.get(uuid)
        self._up[uuid] = up
        metrics.MPS_DAEMON_UP.labels(uuid).set(1 if up else 0)
        if fault is not None:
            self._tracker.record_failure(uuid, fault)
            if was is not False:
                log.warning("GPU %s: %s", uuid, fault)
        elif was is not True:
            log.info("GPU %s: its MPS control daemon answers (pid %s)", uuid, probe.pid)
