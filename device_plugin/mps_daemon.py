"""`python -m device_plugin.mps_daemon --config FILE`: an MPS control daemon per share GPU, kept up.

It runs in a container of its own in the device plugin's DaemonSet and reads the
plugin's config file. With ``mps: true`` it finds the GPUs through the plugin's
NVML backend (the fleet file's node with ``fakeFleet``), and starts
``mpsControl -d`` for every GPU that offers shares (``mps.mps_gpus``), each shown
only its GPU and given its own pipe and log folders under ``mpsRoot``. It then
probes each daemon every second, as the plugin does, and starts again one that
died or stopped answering (killing a stuck one it started), waiting 1 s, then
twice as long after each failed start up to 30 s. The plugin sees the gap, or
the new pid, and moves the GPU's holders. On SIGTERM or SIGINT it tells each
daemon to ``quit``. With MPS off, or no GPU to share, it only waits to be stopped.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from device_plugin.config import PluginConfig, add_flags, load_config
from device_plugin.discovery import discover
from device_plugin.main import make_backend
from device_plugin.mps import daemon_env, mps_gpus
from device_plugin.mps_control import MpsControlError, probe_daemon, read_pid, send, start_daemon
from infergrid.errors import ContractError
from infergrid.inventory import Gpu
from infergrid.nvml.backend import NvmlError
from infergrid.process import configure_logging
from infergrid.share_edits import MpsPaths, gpu_paths, shm_dir

log = logging.getLogger("infergrid.mps_daemon")

CHECK_INTERVAL_S: Final = 1.0
FIRST_RETRY_S: Final = 1.0
LAST_RETRY_S: Final = 30.0
ANSWER_WAIT_S: Final = 10.0
"""How long a daemon just started, or told to quit, may take to answer, or to go."""
_POLL_S: Final = 0.1


@dataclass
class _Daemon:
    """One GPU's daemon as the supervisor knows it: the pid it started, and when to retry."""

    gpu: Gpu
    paths: MpsPaths
    pid: int | None = None
    up: bool = False
    retry_at: float = 0.0
    retry_s: float = FIRST_RETRY_S


class Supervisor:
    """Keeps one control daemon per GPU answering, through the control program ``control``."""

    def __init__(
        self,
        control: str,
        root: Path,
        gpus: Sequence[Gpu],
        base_env: Mapping[str, str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._control = control
        self._root = root
        self._env = dict(base_env)
        self._clock = clock
        self._daemons = [_Daemon(gpu, gpu_paths(root, gpu.uuid)) for gpu in gpus]

    def run(self, stop: threading.Event, interval_s: float = CHECK_INTERVAL_S) -> None:
        """Start every daemon, keep them up until ``stop``, then stop them."""
        _make_shared_memory(shm_dir(self._root))
        for daemon in self._daemons:
            self._start(daemon)
        while not stop.wait(interval_s):
            self.check_once()
            _reap()
        self.stop_all()

    def check_once(self) -> None:
        """Probe every daemon; start again each one that is down and due."""
        for daemon in self._daemons:
            if self._answers(daemon.paths):
                continue
            if daemon.up:
                log.error(
                    "GPU %s: its MPS control daemon (pid %s) died or stopped answering; "
                    "starting another",
                    daemon.gpu.uuid,
                    daemon.pid,
                )
                daemon.up = False
            if self._clock() >= daemon.retry_at:
                self._start(daemon)

    def stop_all(self) -> None:
        for daemon in self._daemons:
            self._quit(daemon)

    def _start(self, daemon: _Daemon) -> None:
        """Start the GPU's daemon in place of any before it; on failure, schedule the next try."""
        self._quit(daemon)
        env = daemon_env(self._env, self._root, daemon.gpu.uuid)
        try:
            daemon.paths.pipe.mkdir(parents=True, exist_ok=True)
            daemon.paths.log.mkdir(parents=True, exist_ok=True)
            start_daemon(self._control, env)
            daemon.pid = read_pid(daemon.paths)  # ours to kill should it never answer
            self._wait(daemon.paths, answering=True)
        except (MpsControlError, OSError) as err:
            daemon.retry_at = self._clock() + daemon.retry_s
            log.error(
                "GPU %s: cannot start its MPS control daemon, next try in %g s: %s",
                daemon.gpu.uuid,
                daemon.retry_s,
                err,
            )
            daemon.retry_s = min(2 * daemon.retry_s, LAST_RETRY_S)
            return
        daemon.pid, daemon.up, daemon.retry_s = read_pid(daemon.paths), True, FIRST_RETRY_S
        log.info(
            "GPU %s (index %d): MPS control daemon pid %s, pipe directory %s",
            daemon.gpu.uuid,
            daemon.gpu.index,
            daemon.pid,
            daemon.paths.pipe,
        )

    def _quit(self, daemon: _Daemon) -> None:
        """End whatever daemon holds the GPU's folders: ``quit``, or a kill if it is stuck."""
        if self._answers(daemon.paths):
            try:
                send(self._control, daemon.paths, "quit")
                self._wait(daemon.paths, answering=False)
                log.info("GPU %s: MPS control daemon (pid %s) quit", daemon.gpu.uuid, daemon.pid)
            except MpsControlError as err:
                log.warning("GPU %s: MPS control daemon did not quit: %s", daemon.gpu.uuid, err)
        if daemon.pid is not None and daemon.pid == read_pid(daemon.paths):
            _kill(daemon.pid)  # one this program started that is still there: stuck
        daemon.pid, daemon.up = None, False

    def _answers(self, paths: MpsPaths) -> bool:
        return probe_daemon(self._control, paths) is None

    def _wait(self, paths: MpsPaths, answering: bool) -> None:
        """Until the daemon answers (or has gone); MpsControlError after ``ANSWER_WAIT_S``."""
        deadline = time.monotonic() + ANSWER_WAIT_S
        while self._answers(paths) != answering:
            if time.monotonic() >= deadline:
                state = "answer" if answering else "go"
                raise MpsControlError(f"the daemon did not {state} within {ANSWER_WAIT_S:g} s")
            time.sleep(_POLL_S)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap() -> None:
    """Collect exited daemons. As its container's PID 1 this program inherits every daemon
    (their ``-d`` parent exits at once), and one that dies stays a zombie until reaped.
    Called between rounds only, so it never takes a control program's exit from subprocess."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def share_gpus(config: PluginConfig) -> tuple[Gpu, ...]:
    """The GPUs that need a daemon, read through the plugin's backend; none with MPS off."""
    if not config.mps:
        return ()
    backend = make_backend(config)
    try:
        inventory = discover(
            backend, config.node_name, None, config.vgpu_slots_per_gpu, config.gpu_replicas
        )
    finally:
        backend.close()
    return mps_gpus(inventory, config)


def _make_shared_memory(path: Path) -> None:
    """The node's MPS shared memory, mode 1777 as /dev/shm always is: every holder mounts it
    there, and holders run as any user (the kubelet's hostPath makes it 0755, root's)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o1777)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="infergrid-mps-daemon", description=__doc__)
    add_flags(parser)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        config = load_config(args, os.environ.get("NODE_NAME"))
        gpus = share_gpus(config)
    except (ContractError, NvmlError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    if not gpus:
        log.info(
            "no GPU of node %s needs an MPS control daemon (mps: %s); waiting to be stopped",
            config.node_name,
            str(config.mps).lower(),
        )
        stopped.wait()
        return 0
    log.info(
        "MPS control daemons for %d GPU(s) of node %s under %s",
        len(gpus),
        config.node_name,
        config.mps_root,
    )
    Supervisor(config.mps_control, config.mps_root, gpus, os.environ).run(stopped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
