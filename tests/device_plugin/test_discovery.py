"""Discovery: the inventory and usage a node publishes, read through the fake NVML."""

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from device_plugin.discovery import discover, sample_usage
from device_plugin.health import HealthTracker
from infergrid.fleet import load_fleet, parse_fleet
from infergrid.inventory import decode_inventory, encode_inventory
from infergrid.nvml.backend import NvmlError
from infergrid.nvml.fake import FakeNvml
from infergrid.usage import GpuUsageSample, decode_usage, encode_usage

SAMPLE = Path(__file__).parents[2] / "e2e" / "fleets" / "sample.yaml"
NODES = {node.name: node for node in load_fleet(SAMPLE).nodes}
HEARTBEAT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def healthy(inventory) -> list[bool]:
    return [gpu.healthy for gpu in inventory.gpus]


@pytest.mark.parametrize("name", NODES)
def test_discovery_publishes_exactly_what_the_fleet_describes(name):
    node = NODES[name]
    inventory = discover(FakeNvml(node), name, None)
    assert inventory == node.inventory
    assert decode_inventory(encode_inventory(inventory)) == inventory


def test_a_gpu_listed_unhealthy_is_published_unhealthy():
    gpus = {
        "model": "NVIDIA L4",
        "count": 4,
        "memoryMiB": 23034,
        "smCount": 58,
        "computeCapability": "8.9",
    }
    doc = {"version": "v1", "nodes": [{"name": "l4", "gpus": gpus, "unhealthy": [1]}]}
    node = parse_fleet(doc, "test").nodes[0]
    inventory = discover(FakeNvml(node), "l4", None)
    assert healthy(inventory) == [True, False, True, True]
    assert inventory == node.inventory


def test_a_failing_gpu_is_unhealthy_with_what_could_be_read():
    fake = FakeNvml(NODES["a100-1"])
    fake.fail("links", 3)
    fake.fail("mig_instances", 0)
    inventory = discover(fake, "a100-1", None)
    assert healthy(inventory) == [False, True, True, False, True, True, True, True]
    gpu0, gpu3 = inventory.gpus[0], inventory.gpus[3]
    assert (gpu0.mig_enabled, gpu0.mig_instances, len(gpu0.links)) == (True, (), 7)
    assert (gpu3.model, gpu3.memory_mib, gpu3.links) == ("NVIDIA A100-SXM4-80GB", 81920, ())
    assert decode_inventory(encode_inventory(inventory)) == inventory


def test_a_gpu_without_an_identity_is_left_out_and_links_to_it_dropped(caplog):
    fake = FakeNvml(NODES["a100-0"])
    fake.fail("device_info", 5)
    with caplog.at_level(logging.WARNING, logger="device_plugin.discovery"):
        inventory = discover(fake, "a100-0", None)
    assert [gpu.index for gpu in inventory.gpus] == [0, 1, 2, 3, 4, 6, 7]
    assert all(link.peer_index != 5 for gpu in inventory.gpus for link in gpu.links)
    assert all(len(gpu.links) == 6 for gpu in inventory.gpus)
    assert "GPU 5 left out of the inventory" in caplog.text
    assert decode_inventory(encode_inventory(inventory)) == inventory


def test_gpus_that_cannot_be_counted_raise():
    fake = FakeNvml(NODES["h100"])
    fake.fail("device_count")
    with pytest.raises(NvmlError, match="device_count"):
        discover(fake, "h100", None)
    with pytest.raises(NvmlError, match="device_count"):
        sample_usage(fake, "h100", HEARTBEAT)


def test_the_health_tracker_decides_and_learns_health():
    fake = FakeNvml(NODES["h100"])
    uuids = [gpu.uuid for gpu in NODES["h100"].inventory.gpus]
    tracker = HealthTracker(quiet_period_s=60, clock=lambda: 0.0)
    tracker.record_xid(uuids[1], 79)
    assert healthy(discover(fake, "h100", tracker)) == [True, False]
    fake.fail("memory_used_mib", 0)
    assert healthy(discover(fake, "h100", tracker)) == [False, False]
    assert tracker.unhealthy() == {
        uuids[0]: "memory_used_mib on GPU 0: injected failure",
        uuids[1]: "XID 79 (GPU has fallen off the bus): needs a GPU reset",
    }


def test_usage_samples_every_gpu_that_answers():
    fake = FakeNvml(NODES["l4-0"])
    uuids = [gpu.uuid for gpu in NODES["l4-0"].inventory.gpus]
    fake.set_memory_used(0, 2048)
    fake.set_utilization(0, 40)
    fake.set_memory_used(3, 512)
    fake.fail("utilization_percent", 2)
    usage = sample_usage(fake, "l4-0", HEARTBEAT)
    assert (usage.node, usage.heartbeat) == ("l4-0", HEARTBEAT)
    assert usage.gpus == (
        GpuUsageSample(uuids[0], 2048, 40),
        GpuUsageSample(uuids[1], 0, 0),
        GpuUsageSample(uuids[3], 512, 0),
    )
    assert decode_usage(encode_usage(usage)) == usage
