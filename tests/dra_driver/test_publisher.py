"""The publisher keeps the node's slices equal to its GPUs and finds disabled gates by what the
API server keeps; the driver's settings and its refusal of a device-plugin node."""

from __future__ import annotations

import argparse
import copy
import threading
from pathlib import Path

import pytest

import dra_driver.publisher as publisher_module
from dra_driver.claims import ApiError
from dra_driver.config import DriverConfig, add_flags, load_config, parse_config
from dra_driver.main import node_owner
from dra_driver.publisher import SlicePublisher
from dra_driver.slices import Features
from infergrid.errors import ContractError
from tests.dra_driver.conftest import MIG_3_2_2, NODE, gpu, mig_gpu

OWNER = {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u-1"}


class FakeSliceApi:
    """ResourceSlices as an API server stores them, dropping the fields of gates that are off."""

    def __init__(self, consumable: bool = True, partitionable: bool = True) -> None:
        self.consumable, self.partitionable = consumable, partitionable
        self.slices: dict[str, dict] = {}
        self.calls: list[str] = []
        self.fail_next = 0
        self._version = 0

    def _stored(self, body: dict) -> dict:
        stored = copy.deepcopy(body)
        spec = stored["spec"]
        for device in spec.get("devices", []):
            if not self.consumable:
                device.pop("allowMultipleAllocations", None)
                for capacity in device.get("capacity", {}).values():
                    capacity.pop("requestPolicy", None)
            if not self.partitionable:
                device.pop("consumesCounters", None)
        if not self.partitionable:
            spec.pop("sharedCounters", None)
        self._version += 1
        stored["metadata"]["resourceVersion"] = str(self._version)
        self.slices[stored["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    def _call(self, what: str) -> None:
        self.calls.append(what)
        if self.fail_next:
            self.fail_next -= 1
            raise ApiError(f"{what}: 500 Internal Server Error")

    def list_slices(self, node: str) -> list[dict]:
        self._call("list")
        return [copy.deepcopy(s) for s in self.slices.values() if s["spec"]["nodeName"] == node]

    def create_slice(self, body: dict) -> dict:
        self._call(f"create {body['metadata']['name']}")
        assert body["metadata"]["name"] not in self.slices
        return self._stored(body)

    def replace_slice(self, body: dict) -> dict:
        name = body["metadata"]["name"]
        self._call(f"update {name}")
        assert (
            body["metadata"]["resourceVersion"] == self.slices[name]["metadata"]["resourceVersion"]
        )
        return self._stored(body)

    def delete_slice(self, name: str) -> None:
        self._call(f"delete {name}")
        del self.slices[name]


GPUS = [gpu(0), mig_gpu(1, MIG_3_2_2)]


def test_publishes_the_pool_once_and_again_only_when_the_gpus_change():
    api = FakeSliceApi()
    publisher = SlicePublisher(api, NODE, OWNER)
    assert publisher.publish(GPUS) is True
    assert sorted(api.slices) == ["node-a-gpu.infergrid.io-0", "node-a-gpu.infergrid.io-1"]
    assert all(s["metadata"]["ownerReferences"] == [OWNER] for s in api.slices.values())
    assert publisher.publish(GPUS) is False
    assert publisher.publish([gpu(0)]) is True
    [only] = api.slices.values()
    assert only["spec"]["pool"] == {"name": NODE, "generation": 2, "resourceSliceCount": 1}
    assert api.calls[-2:] == [
        "update node-a-gpu.infergrid.io-0",
        "delete node-a-gpu.infergrid.io-1",
    ]


def test_a_restarted_driver_continues_the_generation_and_deletes_stale_slices():
    api = FakeSliceApi()
    SlicePublisher(api, NODE, OWNER).publish([gpu(i) for i in range(200)])
    SlicePublisher(api, NODE, OWNER).publish([gpu(0)])
    [only] = api.slices.values()
    assert only["spec"]["pool"]["generation"] == 2


def test_with_both_gates_on_the_gated_fields_stay():
    api = FakeSliceApi()
    publisher = SlicePublisher(api, NODE, OWNER)
    publisher.publish(GPUS)
    assert publisher.features == Features(True, True)
    assert any("sharedCounters" in s["spec"] for s in api.slices.values())


@pytest.mark.parametrize(
    "consumable, partitionable, gate",
    [
        (False, True, "DRAConsumableCapacity"),
        (True, False, "DRAPartitionableDevices"),
        (False, False, "DRAConsumableCapacity and DRAPartitionableDevices"),
    ],
)
def test_a_gate_found_off_is_named_and_the_pool_published_without_it(
    consumable, partitionable, gate, caplog
):
    api = FakeSliceApi(consumable, partitionable)
    publisher = SlicePublisher(api, NODE, OWNER)
    publisher.publish(GPUS)
    assert publisher.features == Features(consumable, partitionable)
    assert f"dropped the fields of {gate}" in caplog.text
    specs = [s["spec"] for s in api.slices.values()]
    assert len(specs) == (2 if partitionable else 1)
    assert {s["pool"]["generation"] for s in specs} == {2}
    devices = [d for s in specs for d in s.get("devices", [])]
    assert all(("allowMultipleAllocations" in d) == (consumable and d["name"] == "gpu-0")
               for d in devices)  # fmt: skip
    assert publisher.publish(GPUS) is False


def test_the_run_loop_retries_a_failing_api_server(monkeypatch):
    api = FakeSliceApi()
    api.fail_next = 2
    stop = threading.Event()
    publisher = SlicePublisher(api, NODE, OWNER)
    rounds = []

    def read():
        rounds.append(1)
        if api.slices:
            stop.set()
        return GPUS

    monkeypatch.setattr(publisher_module, "FIRST_RETRY_S", 0.01)
    publisher.run(read, stop, interval_s=0.01)
    assert len(rounds) >= 3 and api.slices


def test_a_node_in_device_plugin_mode_is_refused():
    node = {"metadata": {"name": NODE, "uid": "u-1",
                         "annotations": {"infergrid.io/gpu-inventory": "{}"}}}  # fmt: skip
    with pytest.raises(ContractError, match="device-plugin mode"):
        node_owner(node)
    del node["metadata"]["annotations"]
    assert node_owner(node) == OWNER


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return parser.parse_args(list(argv))


def test_config_file_then_flags(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("version: v1\nnodeName: n1\nmps: true\ncdiDir: /tmp/cdi\nfakeFleet: ''\n")
    cfg = load_config(args("--config", str(path), "--cdi-dir", "/x/cdi"))
    assert (cfg.node_name, cfg.mps, cfg.cdi_dir, cfg.fake_fleet) == (
        "n1",
        True,
        Path("/x/cdi"),
        None,
    )
    assert cfg.mps_root_or_none == Path("/run/infergrid/mps")
    assert cfg.registry_dir == DriverConfig().registry_dir
    assert load_config(args(), env_node="from-env").node_name == "from-env"


@pytest.mark.parametrize(
    "doc, key",
    [
        ({"version": "v1", "pluginDir": "relative"}, "pluginDir"),
        ({"version": "v1", "registryDir": "/" + "r" * 100}, "registryDir"),
        ({"version": "v1", "metricsPort": 70000}, "metricsPort"),
        ({"version": "v1", "mps": "yes"}, "mps"),
        ({"version": "v1", "gpuReplicas": 2}, "gpuReplicas"),
    ],
)
def test_a_bad_field_is_named(doc, key):
    with pytest.raises(ContractError, match=key):
        parse_config(doc)


def test_a_node_name_is_required():
    with pytest.raises(ContractError, match="nodeName"):
        load_config(args())
