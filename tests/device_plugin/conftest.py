"""A running device plugin on fake NVML, talking to a fake kubelet over unix sockets.

The plugin's modules are imported where the fixtures use them, not here: the real-NVML tests
(test_real_nvml.py) then load with pynvml alone, on a GPU machine without grpcio, protobuf or
PyYAML."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from infergrid.assignment_annotation import (
    AssignedGpu,
    AssignedMig,
    ContainerAssignment,
    PodAssignment,
)
from infergrid.constants import SCHEDULER_NAME
from infergrid.records import PodRecord

if TYPE_CHECKING:
    from device_plugin.allocator import Grant
    from device_plugin.fake_kubelet import FakeKubelet
    from device_plugin.manager import HeldSource, PodSource
    from device_plugin.pod_health import PodConditions
    from device_plugin.runtime import DevicePluginRuntime
    from device_plugin.toolkit import NodeCondition
    from infergrid.nvml.fake import FakeNvml

SAMPLE = Path(__file__).resolve().parents[2] / "e2e" / "fleets" / "sample.yaml"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class StaticPods:
    """The node's pods as a test sets them."""

    items: list[PodRecord] = field(default_factory=list)

    def pods(self) -> list[PodRecord]:
        return list(self.items)


def whole(name: str, *uuids: str, memory: int = 23034) -> ContainerAssignment:
    return ContainerAssignment(name, gpus=tuple(AssignedGpu(u, memory, 100) for u in uuids))


def share(name: str, uuid: str, memory: int, cores: int = 50) -> ContainerAssignment:
    return ContainerAssignment(name, gpus=(AssignedGpu(uuid, memory, cores),), shared=True)


def mig(name: str, uuid: str, profile: str, gpu_uuid: str) -> ContainerAssignment:
    return ContainerAssignment(name, mig=AssignedMig(uuid, profile, gpu_uuid))


def pod(
    name: str,
    node: str,
    *containers: ContainerAssignment,
    age_s: int = 0,
    scheduler: str = SCHEDULER_NAME,
) -> PodRecord:
    assigned = PodAssignment(node, T0 + timedelta(seconds=age_s), containers)
    return PodRecord(f"uid-{name}", "default", name, node, scheduler, assigned)


@dataclass
class Running:
    kubelet: FakeKubelet
    runtime: DevicePluginRuntime
    nvml: FakeNvml
    pods: StaticPods  # or the PodSource the test passed
    granted: list[Grant]

    def gpu(self, index: int):
        return next(g for g in self.runtime.manager.inventory.gpus if g.index == index)


@pytest.fixture()
def short_dir():
    """Unix socket paths must stay under 108 bytes; pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def fake_mps_control(tmp_path_factory) -> str:
    """The fake MPS control program as an executable file, as its console script installs it."""
    program = tmp_path_factory.mktemp("bin") / "infergrid-fake-mps-control"
    program.write_text(f'#!/bin/sh\nexec {sys.executable} -m device_plugin.fake_mps_control "$@"\n')
    program.chmod(0o755)
    return str(program)


@dataclass
class FakeDaemons:
    """Fake MPS control daemons under ``root``, started and killed as a test says."""

    control: str
    root: Path
    started: list[int] = field(default_factory=list)

    @property
    def settings(self) -> dict:
        """The plugin settings that turn MPS on over these daemons."""
        return {"mps": True, "mps_root": self.root, "mps_control": self.control}

    def start(self, *uuids: str) -> None:
        from device_plugin.mps import daemon_env
        from device_plugin.mps_control import start_daemon

        for uuid in uuids:
            start_daemon(self.control, daemon_env(os.environ, self.root, uuid))
            self.started.append(self.pid(uuid))

    def pid(self, uuid: str) -> int:
        from infergrid.share_edits import gpu_paths

        return int(gpu_paths(self.root, uuid).pid_file.read_text())

    def kill(self, uuid: str, sig: int = signal.SIGKILL) -> None:
        """SIGKILL: the daemon crashed; SIGSTOP: it is stuck (takes connections, never answers)."""
        os.kill(self.pid(uuid), sig)

    def records(self, uuid: str) -> list[dict]:
        """What GPU ``uuid``'s daemons were told, in order, each with the daemon's pid."""
        from device_plugin.fake_mps_control import RECORD
        from infergrid.share_edits import gpu_paths

        lines = (gpu_paths(self.root, uuid).log / RECORD).read_text().splitlines()
        return [json.loads(line) for line in lines]

    def kill_all(self) -> None:
        for pid in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture()
def mps_daemons(short_dir, fake_mps_control):
    daemons = FakeDaemons(fake_mps_control, short_dir / "mps")
    yield daemons
    daemons.kill_all()


@pytest.fixture()
def start_plugin(short_dir):
    started: list[Running] = []

    from device_plugin.config import PluginConfig
    from device_plugin.fake_kubelet import FakeKubelet
    from device_plugin.health import HealthTracker
    from device_plugin.runtime import DevicePluginRuntime
    from infergrid.fleet import load_fleet
    from infergrid.nvml.fake import FakeNvml

    def start(
        node: str = "l4-0",
        fleet: Path = SAMPLE,
        pods: PodSource | None = None,
        held: HeldSource | None = None,
        pod_conditions: PodConditions | None = None,
        node_condition: Callable[[NodeCondition], object] | None = None,
        **settings,
    ) -> Running:
        """A plugin on ``node``; ``pods`` (StaticPods by default) is where it reads the pods,
        ``held`` where it reads what the kubelet shows held (none: grants are marked at once),
        ``pod_conditions`` where it writes pods' GPUHealthy conditions (none: nowhere),
        ``node_condition`` where it writes the node's toolkit condition (none: nowhere)."""
        fleet_node = next(n for n in load_fleet(fleet).nodes if n.name == node)
        nvml = FakeNvml(fleet_node)
        kubelet = FakeKubelet(short_dir)
        kubelet.start()
        config = PluginConfig(node_name=node, plugin_dir=short_dir, metrics_port=0, **settings)
        pods, granted = pods or StaticPods(), []
        runtime = DevicePluginRuntime(
            config,
            nvml,
            pods,
            on_grants=granted.extend,
            tracker=HealthTracker(config.health_quiet_period_s),
            held=held,
            pod_conditions=pod_conditions,
            node_condition=node_condition,
        )
        runtime.start()
        running = Running(kubelet, runtime, nvml, pods, granted)
        started.append(running)
        return running

    yield start
    for running in started:
        running.runtime.stop()
        running.kubelet.stop()
