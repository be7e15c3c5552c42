"""The MPS daemons' container program, run for real on a fake fleet with the fake control
program: one daemon per GPU that offers shares, each shown its GPU; a dead one is started again;
SIGTERM makes every daemon quit."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from device_plugin.mps_control import PROBE, MpsControlError, read_pid, send
from device_plugin.mps_daemon import Supervisor
from infergrid.fleet import load_fleet
from infergrid.share_edits import gpu_paths
from tests.device_plugin.conftest import FakeDaemons
from tests.device_plugin.test_pod_health import FakeClock
from tests.placement.builders import gpu

FLEET = """\
version: v1
nodes:
  - name: mps-node
    gpus: {model: NVIDIA A100-SXM4-80GB, count: 3, memoryMiB: 81920, smCount: 108,
           computeCapability: "8.0"}
    mig:
      "0": [3g.40gb, 3g.40gb]
"""


def eventually(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def ended(pid: int) -> bool:
    """Whether the process has exited: gone, or a zombie its adopter has not reaped yet."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


class Program:
    """``python -m device_plugin.mps_daemon --config FILE`` on a node of three GPUs, GPU 0 in
    MIG mode, with its output in a file."""

    def __init__(self, folder: Path, control: str, **settings: object) -> None:
        fleet = folder / "fleet.yaml"
        fleet.write_text(FLEET)
        self.root = folder / "mps"
        self.daemons = FakeDaemons(control, self.root)
        self.uuids = [g.uuid for g in load_fleet(fleet).nodes[0].inventory.gpus]
        config = folder / "device-plugin.yaml"
        lines = {"version": "v1", "nodeName": "mps-node", "fakeFleet": fleet, "mps": "true",
                 "mpsRoot": self.root, "mpsControl": control, **settings}  # fmt: skip
        config.write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
        self.output = folder / "output.txt"
        with self.output.open("w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "device_plugin.mps_daemon", "--config", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def answering_pid(self, uuid: str) -> int | None:
        """The pid of GPU ``uuid``'s daemon if one answers."""
        paths = gpu_paths(self.root, uuid)
        try:
            send(self.daemons.control, paths, PROBE)
        except MpsControlError:
            return None
        return read_pid(paths)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(20)

    def kill_daemons(self) -> None:
        for uuid in self.uuids:
            if gpu_paths(self.root, uuid).pid_file.exists():
                with contextlib.suppress(ProcessLookupError):
                    self.daemons.kill(uuid)


@pytest.fixture()
def program(short_dir, fake_mps_control):
    started: list[Program] = []

    def run(**settings: object) -> Program:
        started.append(Program(short_dir, fake_mps_control, **settings))
        return started[-1]

    yield run
    for p in started:
        if p.process.poll() is None:
            p.process.terminate()  # its daemons quit with it
            try:
                p.process.wait(30)
            except subprocess.TimeoutExpired:
                p.process.kill()
        p.kill_daemons()


def test_each_share_gpu_gets_a_daemon_shown_only_it_and_sigterm_makes_them_quit(program):
    p = program()
    mig_gpu, *shared = p.uuids
    eventually(lambda: all(p.answering_pid(u) for u in shared))
    for uuid in shared:
        assert p.daemons.records(uuid)[0] | {"at": 0} == {
            "at": 0,
            "pid": p.daemons.pid(uuid),
            "command": "-d",
            "visibleDevices": uuid,
        }
    assert not (p.root / mig_gpu).exists()  # in MIG mode: no shares, no daemon
    # Shared memory every holder mounts as /dev/shm, whatever its user, as /dev/shm is.
    assert (p.root / "shm").stat().st_mode & 0o7777 == 0o1777
    assert p.stop() == 0
    for uuid in shared:
        assert p.daemons.records(uuid)[-1]["command"] == "quit"
        assert not gpu_paths(p.root, uuid).pid_file.exists()
    assert "MPS control daemon pid" in p.output.read_text()


def test_a_daemon_that_dies_is_started_again(program):
    p = program()
    uuid = p.uuids[1]
    eventually(lambda: p.answering_pid(uuid) is not None)
    first = p.answering_pid(uuid)
    os.kill(first, signal.SIGKILL)
    eventually(lambda: p.answering_pid(uuid) not in (None, first))
    assert p.stop() == 0
    assert "died or stopped answering; starting another" in p.output.read_text()


def test_a_stuck_daemon_is_killed_and_started_again(program):
    p = program()
    uuid = p.uuids[2]
    eventually(lambda: f"{uuid} (index 2): MPS control daemon pid" in p.output.read_text())
    first = read_pid(gpu_paths(p.root, uuid))
    os.kill(first, signal.SIGSTOP)
    eventually(lambda: p.answering_pid(uuid) not in (None, first), 40)
    assert ended(first)
    assert p.stop() == 0


def test_with_mps_off_it_starts_nothing_and_waits_to_be_stopped(program):
    p = program(mps="false")
    eventually(lambda: "waiting to be stopped" in p.output.read_text())
    assert p.process.poll() is None and not p.root.exists()
    assert p.stop() == 0


def test_a_bad_setting_stops_it_at_start_with_the_field_named(program):
    p = program(mpsRoot="relative/mps")
    assert p.process.wait(20) == 2
    assert "error: mpsRoot: must be an absolute path" in p.output.read_text()


def test_a_daemon_that_will_not_start_is_tried_again_ever_more_slowly(tmp_path):
    calls = tmp_path / "calls"
    control = tmp_path / "broken-mps-control"
    control.write_text(f'#!/bin/sh\necho "start $*" >> {calls}\necho "no GPU" >&2\nexit 1\n')
    control.chmod(0o755)
    clock = FakeClock()
    supervisor = Supervisor(str(control), tmp_path / "mps", [gpu(0)], os.environ, clock)
    tried_at = []
    for second in range(64):
        clock.now = 100.0 + second
        before = calls.read_text().count("start -d") if calls.exists() else 0
        supervisor.check_once()
        if calls.read_text().count("start -d") > before:
            tried_at.append(second)
    assert tried_at == [0, 1, 3, 7, 15, 31, 61]  # waits of 1, 2, 4, 8, 16, then 30 s at most
