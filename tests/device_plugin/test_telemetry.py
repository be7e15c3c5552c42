"""GPU telemetry: the series a node's GPUs export, whom they name, and what NVML withholds."""

import logging
import re
import threading
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from device_plugin import metrics
from device_plugin.allocator import AllocationError
from device_plugin.config import PluginConfig
from device_plugin.devices import by_id, resource_devices
from device_plugin.discovery import discover
from device_plugin.health import HealthTracker
from device_plugin.holdings import Held
from device_plugin.manager import DeviceManager
from device_plugin.publisher import NodePublisher
from device_plugin.telemetry import (
    TELEMETRY_METRICS,
    Holder,
    Reading,
    TelemetrySampler,
    counter_step,
    holders_of,
    telemetry_samples,
    unsupported,
)
from infergrid.assignment_annotation import (
    AssignedGpu,
    AssignedMig,
    ContainerAssignment,
    PodAssignment,
)
from infergrid.fleet import load_fleet
from infergrid.inventory import GpuInventory
from infergrid.nvml.backend import GpuProcess, MigTelemetry, Telemetry
from infergrid.nvml.fake import FakeNvml
from infergrid.records import PodRecord

ROOT = Path(__file__).parents[2]
SAMPLE = ROOT / "e2e" / "fleets" / "sample.yaml"
NODES = {node.name: node for node in load_fleet(SAMPLE).nodes}
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def inventory_of(fake: FakeNvml, node: str, time_slices: int = 1) -> GpuInventory:
    """The fake's GPUs under a node name of the test's own, so its series are its own."""
    return discover(fake, node, None, time_slices=time_slices)


def devices_of(inventory: GpuInventory, replicas: int = 1) -> dict:
    config = PluginConfig(node_name=inventory.node, gpu_replicas=replicas)
    return resource_devices(inventory, config, lambda uuid: True)


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def series(name: str, node: str) -> list[dict[str, str]]:
    """The label sets of every series of ``name`` on ``node``."""
    return [
        s.labels
        for family in REGISTRY.collect()
        for s in family.samples
        if s.name == name and s.labels.get("node") == node
    ]


def share_pod(name: str, gpu_uuid: str, mib: int) -> PodRecord:
    container = ContainerAssignment("engine", gpus=(AssignedGpu(gpu_uuid, mib, 50),), shared=True)
    assignment = PodAssignment("n", T0, (container,))
    return PodRecord(f"uid-{name}", "demo", name, "n", "infergrid-scheduler", assignment)


class Kubelet:
    """PodResources as a test sets it; ``answers`` False plays a kubelet that does not answer."""

    def __init__(self, *held: Held) -> None:
        self.held = list(held)
        self.answers = True

    def list(self) -> list[Held] | None:
        return list(self.held) if self.answers else None

    def describe(self) -> str:
        return "the test's kubelet"


class Pods:
    """The API server's pods of the node, counting how often it is asked."""

    def __init__(self, *pods: PodRecord) -> None:
        self.items = list(pods)
        self.calls = 0
        self.down = False

    def pods(self) -> list[PodRecord]:
        self.calls += 1
        if self.down:
            raise AllocationError("the API server did not list the pods")
        return list(self.items)


def held(pod: str, resource: str, *devices: str, container: str = "engine") -> Held:
    return Held("demo", pod, container, resource, frozenset(devices))


# Who holds what.


def test_each_holder_holds_its_part_of_the_gpu():
    fake = FakeNvml(NODES["local-a100"])
    inventory = inventory_of(fake, "n")
    whole, mig_gpu, shared = inventory.gpus
    instance = mig_gpu.mig_instances[0]
    known = by_id(devices_of(inventory))
    kubelet = [
        held("trainer", "nvidia.com/gpu", whole.uuid),
        held("small", "nvidia.com/mig-3g.40gb", instance.uuid),
        held("chat", "infergrid.io/vgpu", f"{shared.uuid}::vgpu-0"),
        held("other", "example.com/fpga", "fpga-0"),  # not this plugin's device
    ]
    assignments = {("demo", "chat"): share_pod("chat", shared.uuid, 8192).assignment}
    found = holders_of(kubelet, known, assignments, time_slices=1)
    assert [(h.gpu.uuid, h.mig_uuid, h.pod, h.ratio) for h in found] == [
        (whole.uuid, "", "trainer", 1.0),
        (mig_gpu.uuid, instance.uuid, "small", 40192 / 81920),
        (shared.uuid, "", "chat", 0.1),
    ]


def test_a_time_slice_holds_its_slice_and_a_share_of_unknown_size_is_left_out():
    fake = FakeNvml(NODES["h100"])
    inventory = inventory_of(fake, "n", time_slices=4)
    gpu = inventory.gpus[0]
    known = by_id(devices_of(inventory, replicas=4))
    kubelet = [
        held("a", "nvidia.com/gpu", f"{gpu.uuid}::0"),
        held("b", "nvidia.com/gpu", f"{gpu.uuid}::1", f"{gpu.uuid}::2"),
        held("c", "infergrid.io/vgpu", f"{gpu.uuid}::vgpu-3"),
    ]
    found = holders_of(kubelet, known, {("demo", "c"): None}, time_slices=4)
    assert [(h.pod, h.ratio) for h in found] == [("a", 0.25), ("b", 0.5)]


# From readings to series.


def h100_reading(**values: object) -> Reading:
    """An idle fake H100's reading, with ``values`` instead of its own."""
    fake = FakeNvml(NODES["h100"])
    return Reading(inventory_of(fake, "n").gpus[0], replace(fake.telemetry(0), **values))


def by_metric(samples, metric) -> dict[tuple[str, ...], float]:
    return {s.labels: s.value for s in samples if s.metric is metric}


def test_device_wide_values_name_the_gpu_once_and_each_holder_has_its_own_series():
    reading = h100_reading(power_watts=300.0)
    gpu = reading.gpu
    holders = [
        Holder(gpu, "", "demo", "chat", "engine", 0.25),
        Holder(gpu, "", "demo", "code", "engine", 0.5),
    ]
    samples = telemetry_samples("n", [reading], holders)
    assert by_metric(samples, metrics.GPU_POWER) == {("n", gpu.uuid, gpu.model): 300.0}
    assert by_metric(samples, metrics.GPU_HELD) == {
        ("n", gpu.uuid, gpu.model, "", "demo", "chat", "engine"): 0.25,
        ("n", gpu.uuid, gpu.model, "", "demo", "code", "engine"): 0.5,
    }


def test_a_process_names_the_pod_only_where_one_container_holds_its_gpu():
    reading = h100_reading(processes=(GpuProcess(4242, 1000),))
    gpu = reading.gpu
    alone = [Holder(gpu, "", "demo", "chat", "engine", 1.0)]
    shared = [*alone, Holder(gpu, "", "demo", "code", "engine", 0.5)]
    for holders, pod in ((alone, ("demo", "chat", "engine")), (shared, ("", "", ""))):
        samples = telemetry_samples("n", [reading], holders)
        labels = ("n", gpu.uuid, gpu.model, "", "4242", *pod)
        assert by_metric(samples, metrics.PROCESS_MEMORY_USED) == {labels: 1000}


def test_a_mig_instances_memory_and_processes_name_the_instance_and_its_holder():
    fake = FakeNvml(NODES["a100-1"])
    gpu = inventory_of(fake, "n").gpus[0]
    first, second = gpu.mig_instances
    reading = Reading(
        gpu,
        Telemetry(
            power_watts=90.0,
            mig=(
                MigTelemetry(first.uuid, 3000, (GpuProcess(7, 3000),)),
                MigTelemetry(second.uuid, 0, ()),
            ),
        ),
    )
    holders = [Holder(gpu, first.uuid, "demo", "small", "engine", 0.49)]
    samples = telemetry_samples("n", [reading], holders)
    gpu_labels = ("n", gpu.uuid, gpu.model)
    assert by_metric(samples, metrics.MIG_MEMORY_USED) == {
        (*gpu_labels, first.uuid, "3g.40gb"): 3000,
        (*gpu_labels, second.uuid, "3g.40gb"): 0,
    }
    assert by_metric(samples, metrics.PROCESS_MEMORY_USED) == {
        (*gpu_labels, first.uuid, "7", "demo", "small", "engine"): 3000
    }
    assert by_metric(samples, metrics.GPU_UTILIZATION) == {}


def test_clock_throttle_reasons_are_a_series_each_named_as_dcgm_names_them():
    reading = h100_reading(throttle_reasons=0x4 | 0x40)
    throttled = by_metric(telemetry_samples("n", [reading], []), metrics.GPU_CLOCKS_THROTTLED)
    active = {labels[-1] for labels, v in throttled.items() if v == 1.0}
    assert active == {"power_cap", "hw_thermal"}
    assert len(throttled) == 9


def test_a_value_nvml_does_not_offer_has_no_series():
    fake = FakeNvml(NODES["l4-0"])
    gpu = inventory_of(fake, "n").gpus[0]
    reading = Reading(gpu, fake.telemetry(0))
    assert unsupported(reading) == ["nvlink_tx_bytes", "nvlink_rx_bytes"]
    assert by_metric(telemetry_samples("n", [reading], []), metrics.GPU_NVLINK_BYTES) == {}


def test_a_mig_gpus_own_processes_are_not_missing_but_read_per_instance():
    fake = FakeNvml(NODES["a100-1"])
    gpu = inventory_of(fake, "n").gpus[0]
    reading = Reading(gpu, fake.telemetry(0))
    assert unsupported(reading) == ["utilization_percent", "memory_bandwidth_percent"]


@pytest.mark.parametrize(
    ("previous", "now", "step"), [(None, 500, 0), (500, 800, 300), (800, 100, 100)]
)
def test_a_byte_counter_counts_what_grew_and_starts_again_after_a_driver_reload(
    previous, now, step
):
    assert counter_step(previous, now) == step


# The sampler: reading the GPUs and the kubelet each round.


def test_a_fake_node_under_load_exports_its_telemetry_and_holders():
    fake = FakeNvml(NODES["local-a100"])
    inventory = inventory_of(fake, "t-load")
    whole = inventory.gpus[0]
    sampler = TelemetrySampler(fake, Kubelet(held("trainer", "nvidia.com/gpu", whole.uuid)))
    fake.set_utilization(0, 100)
    fake.set_memory_used(0, 60000)
    sampler.sample(inventory, devices_of(inventory))
    gpu = {"node": "t-load", "gpu_uuid": whole.uuid, "model": whole.model}
    assert value("infergrid_device_plugin_gpu_power_watts", **gpu) == 400.0
    assert value("infergrid_device_plugin_gpu_memory_used_mib", **gpu) == 60000
    assert value("infergrid_device_plugin_gpu_utilization_percent", **gpu) == 100
    assert value("infergrid_device_plugin_gpu_clocks_throttled", **gpu, reason="power_cap") == 1
    pod = {"namespace": "demo", "pod": "trainer", "container": "engine"}
    assert value("infergrid_device_plugin_gpu_held_ratio", **gpu, mig_uuid="", **pod) == 1.0
    process = {**gpu, "mig_uuid": "", "pid": "4000", **pod}
    assert value("infergrid_device_plugin_gpu_process_memory_used_mib", **process) == 60000


def test_each_gpus_missing_values_are_told_in_one_line_once(caplog):
    fake = FakeNvml(NODES["l4-0"])
    inventory = inventory_of(fake, "t-told")
    sampler = TelemetrySampler(fake)
    with caplog.at_level(logging.INFO, logger="device_plugin.telemetry"):
        for _ in range(3):
            sampler.sample(inventory, devices_of(inventory))
    told = [r.getMessage() for r in caplog.records if "does not offer" in r.getMessage()]
    assert told == [
        f"GPU {gpu.uuid} (NVIDIA L4): NVML does not offer nvlink_tx_bytes, nvlink_rx_bytes; "
        "left out of its telemetry"
        for gpu in inventory.gpus
    ]


def test_a_gpu_that_cannot_be_read_counts_an_error_and_has_no_series_until_it_reads(caplog):
    fake = FakeNvml(NODES["h100"])
    inventory = inventory_of(fake, "t-fail")
    sampler = TelemetrySampler(fake)
    sampler.sample(inventory, devices_of(inventory))
    errors = value("infergrid_device_plugin_nvml_errors_total", call="telemetry") or 0
    lost = inventory.gpus[1].uuid
    fake.fail("telemetry", 1)
    with caplog.at_level(logging.WARNING, logger="device_plugin.telemetry"):
        for _ in range(2):
            sampler.sample(inventory, devices_of(inventory))
    assert value("infergrid_device_plugin_nvml_errors_total", call="telemetry") == errors + 2
    assert [r.getMessage() for r in caplog.records] == [
        f"GPU {lost} has no telemetry until it reads again: telemetry on GPU 1: injected failure"
    ]
    power = series("infergrid_device_plugin_gpu_power_watts", "t-fail")
    assert [s["gpu_uuid"] for s in power] == [inventory.gpus[0].uuid]
    fake.heal()
    sampler.sample(inventory, devices_of(inventory))
    assert len(series("infergrid_device_plugin_gpu_power_watts", "t-fail")) == 2


def test_a_holder_that_leaves_takes_its_series_and_its_processes_pod_with_it():
    fake = FakeNvml(NODES["h100"])
    inventory = inventory_of(fake, "t-leave")
    gpu = inventory.gpus[0]
    kubelet = Kubelet(held("trainer", "nvidia.com/gpu", gpu.uuid))
    sampler = TelemetrySampler(fake, kubelet)
    fake.set_memory_used(0, 1000)
    sampler.sample(inventory, devices_of(inventory))
    assert len(series("infergrid_device_plugin_gpu_held_ratio", "t-leave")) == 1
    kubelet.held = []
    sampler.sample(inventory, devices_of(inventory))
    assert series("infergrid_device_plugin_gpu_held_ratio", "t-leave") == []
    (process,) = series("infergrid_device_plugin_gpu_process_memory_used_mib", "t-leave")
    assert (process["pid"], process["pod"]) == ("4000", "")


def test_the_api_server_is_asked_only_when_a_new_share_holder_appears():
    fake = FakeNvml(NODES["h100"])
    inventory = inventory_of(fake, "t-shares")
    gpu = inventory.gpus[0]
    kubelet = Kubelet(held("chat", "infergrid.io/vgpu", f"{gpu.uuid}::vgpu-0"))
    pods = Pods(share_pod("chat", gpu.uuid, 8156), share_pod("code", gpu.uuid, 16311))
    sampler = TelemetrySampler(fake, kubelet, pods)
    for _ in range(3):
        sampler.sample(inventory, devices_of(inventory))
    assert pods.calls == 1
    kubelet.held.append(held("code", "infergrid.io/vgpu", f"{gpu.uuid}::vgpu-1"))
    for _ in range(3):
        sampler.sample(inventory, devices_of(inventory))
    assert pods.calls == 2
    ratios = {s["pod"] for s in series("infergrid_device_plugin_gpu_held_ratio", "t-shares")}
    assert ratios == {"chat", "code"}
    labels = {"node": "t-shares", "gpu_uuid": gpu.uuid, "model": gpu.model, "mig_uuid": ""}
    code = {**labels, "namespace": "demo", "pod": "code", "container": "engine"}
    assert value("infergrid_device_plugin_gpu_held_ratio", **code) == 16311 / 81559


def test_holders_stay_while_the_kubelet_or_the_api_server_does_not_answer():
    fake = FakeNvml(NODES["h100"])
    inventory = inventory_of(fake, "t-quiet")
    gpu = inventory.gpus[0]
    kubelet = Kubelet(held("trainer", "nvidia.com/gpu", gpu.uuid))
    pods = Pods()
    pods.down = True
    sampler = TelemetrySampler(fake, kubelet, pods)
    sampler.sample(inventory, devices_of(inventory))
    kubelet.answers = False
    sampler.sample(inventory, devices_of(inventory))
    assert [s["pod"] for s in series("infergrid_device_plugin_gpu_held_ratio", "t-quiet")] == [
        "trainer"
    ]
    kubelet.answers = True
    kubelet.held.append(held("chat", "infergrid.io/vgpu", f"{gpu.uuid}::vgpu-0"))
    sampler.sample(inventory, devices_of(inventory))  # the share's size is unknown: left out
    assert [s["pod"] for s in series("infergrid_device_plugin_gpu_held_ratio", "t-quiet")] == [
        "trainer"
    ]


def test_a_node_with_no_kubelet_reads_its_holders_from_the_assignments():
    """A KWOK node's plugin has no PodResources to ask: the extender's assignments say who
    holds what, a whole GPU, a MIG instance and a share alike, and only this node's."""
    fake = FakeNvml(NODES["local-a100"])
    inventory = inventory_of(fake, "t-kwok")
    whole, mig_gpu, shared = inventory.gpus
    instance = mig_gpu.mig_instances[0]

    def pod(name: str, node: str, container: ContainerAssignment) -> PodRecord:
        assignment = PodAssignment(node, T0, (container,))
        return PodRecord(f"uid-{name}", "demo", name, node, "infergrid-scheduler", assignment)

    share = (AssignedGpu(shared.uuid, 8192, 25),)
    pods = Pods(
        pod(
            "trainer",
            "t-kwok",
            ContainerAssignment("train", gpus=(AssignedGpu(whole.uuid, 1, 100),)),
        ),
        pod(
            "small",
            "t-kwok",
            ContainerAssignment("embed", mig=AssignedMig(instance.uuid, "3g", "")),
        ),
        pod("chat", "t-kwok", ContainerAssignment("engine", gpus=share, shared=True)),
        pod("away", "other-node", ContainerAssignment("engine", gpus=share, shared=True)),
    )
    heard: list[dict[str, float]] = []  # what a fake NVML would run (FakeNvml.run)
    sampler = TelemetrySampler(fake, None, pods, heard.append)
    sampler.sample(inventory, devices_of(inventory))
    assert heard == [{
        whole.uuid: 1.0,
        mig_gpu.uuid: instance.memory_mib / mig_gpu.memory_mib,
        shared.uuid: 8192 / shared.memory_mib,
    }]  # fmt: skip
    found = {
        (s["pod"], s["container"], s["mig_uuid"])
        for s in series("infergrid_device_plugin_gpu_held_ratio", "t-kwok")
    }
    assert found == {
        ("trainer", "train", ""),
        ("small", "embed", instance.uuid),
        ("chat", "engine", ""),
    }
    labels = {"node": "t-kwok", "gpu_uuid": shared.uuid, "model": shared.model, "mig_uuid": ""}
    chat = {**labels, "namespace": "demo", "pod": "chat", "container": "engine"}
    assert value("infergrid_device_plugin_gpu_held_ratio", **chat) == 8192 / shared.memory_mib
    pods.items = pods.items[:1]  # the others left: their series go with them
    sampler.sample(inventory, devices_of(inventory))
    assert [s["pod"] for s in series("infergrid_device_plugin_gpu_held_ratio", "t-kwok")] == [
        "trainer"
    ]


def test_nvlink_bytes_are_counted_from_the_plugins_start():
    clock = FakeClock()
    fake = FakeNvml(NODES["h100"], clock=clock)
    inventory = inventory_of(fake, "t-nvlink")
    gpu = inventory.gpus[0]
    sampler = TelemetrySampler(fake)
    fake.set_utilization(0, 50)
    clock.now += 60  # moved before the plugin started: not counted
    sampler.sample(inventory, devices_of(inventory))
    labels = {"node": "t-nvlink", "gpu_uuid": gpu.uuid, "model": gpu.model, "direction": "tx"}
    assert value("infergrid_device_plugin_gpu_nvlink_bytes_total", **labels) == 0
    clock.now += 10
    sampler.sample(inventory, devices_of(inventory))
    per_second = 18 * 25 * 10**9 * 0.1 * 0.5
    assert value("infergrid_device_plugin_gpu_nvlink_bytes_total", **labels) == 10 * per_second


def test_the_publisher_exports_the_telemetry_every_round():
    fake = FakeNvml(NODES["l4-0"])
    config = PluginConfig(node_name="t-publisher")
    tracker = HealthTracker(60)
    manager = DeviceManager(config, inventory_of(fake, "t-publisher"), tracker.is_healthy, Pods())
    publisher = NodePublisher(fake, tracker, manager, None, 5.0, threading.Event())
    fake.set_utilization(2, 40)
    publisher.publish_once()
    gpu = manager.inventory.gpus[2]
    labels = {"node": "t-publisher", "gpu_uuid": gpu.uuid, "model": "NVIDIA L4"}
    assert value("infergrid_device_plugin_gpu_utilization_percent", **labels) == 40
    assert value("infergrid_device_plugin_gpu_temperature_celsius", **labels) is not None


# The documentation: every series, its labels, and the DCGM exporter field beside it.


def documented_telemetry() -> dict[str, tuple[set[str], str]]:
    """The README's telemetry table (the docs site includes it): metric -> (its labels, the
    DCGM exporter column)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("[start:telemetry]", 1)[1].split("[end:telemetry]", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `infergrid_"):
            name, more, _unit, _call, dcgm = (c.strip() for c in line.strip("|").split("|"))
            labels = set(re.findall(r"`([a-z_]+)`", more.split("(")[0]))
            rows[name.strip("`")] = ({"node", "gpu_uuid", "model"} | labels, dcgm)
    return rows


def test_every_telemetry_series_is_documented_with_its_labels_beside_dcgm_exporters_name():
    fake = FakeNvml(NODES["local-a100"])
    inventory = inventory_of(fake, "t-docs")
    whole, mig_gpu, _ = inventory.gpus
    kubelet = Kubelet(
        held("trainer", "nvidia.com/gpu", whole.uuid),
        held("small", "nvidia.com/mig-3g.40gb", mig_gpu.mig_instances[0].uuid),
    )
    fake.set_utilization(0, 50)
    fake.set_memory_used(0, 1000)
    TelemetrySampler(fake, kubelet).sample(inventory, devices_of(inventory))
    exported = {}
    for family in REGISTRY.collect():
        for s in family.samples:
            if s.labels.get("node") == "t-docs" and not s.name.endswith("_created"):
                exported.setdefault(s.name, set()).update(s.labels)
    documented = documented_telemetry()
    assert exported == {name: labels for name, (labels, _) in documented.items()}
    assert len(documented) == len(TELEMETRY_METRICS)
    assert all(dcgm for _, dcgm in documented.values())
