"""A node's GPUs become ResourceSlices the API server accepts, shaped by the two alpha gates."""

from __future__ import annotations

import pytest

from dra_driver.slices import (
    GATE_CONSUMABLE_CAPACITY,
    GATE_PARTITIONABLE_DEVICES,
    MAX_DEVICES,
    MAX_DEVICES_CONSUMING_COUNTERS,
    Features,
    build_slices,
    dropped_gates,
    node_devices,
    nvlink_cliques,
    profile_slices,
    slice_name,
    without,
)
from infergrid import dra
from infergrid.constants import LINK_NVLINK
from infergrid.inventory import GpuLink
from tests.dra_driver.conftest import MIG_3_2_2, NODE, gpu, mig_gpu, nvlinked

STATIC = Features(consumable_capacity=False, partitionable_devices=False)
OWNER = {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u-1"}


def devices(slices: list[dict]) -> dict[str, dict]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def counter_sets(slices: list[dict]) -> dict[str, dict]:
    return {c["name"]: c for s in slices for c in s["spec"].get("sharedCounters", [])}


def test_a_plain_gpu_is_one_whole_device_with_every_attribute():
    [s] = build_slices(NODE, [gpu(0)], STATIC, 3, OWNER)
    assert s["apiVersion"] == "resource.k8s.io/v1" and s["kind"] == "ResourceSlice"
    assert s["metadata"] == {"name": "node-a-gpu.infergrid.io-0", "ownerReferences": [OWNER]}
    spec = s["spec"]
    assert spec["driver"] == "gpu.infergrid.io" and spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": 1}
    assert spec["devices"] == [
        {
            "name": "gpu-0",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": gpu(0).uuid},
                "index": {"int": 0},
                "smCount": {"int": 108},
                "model": {"string": "NVIDIA A100-SXM4-80GB"},
                "computeCapability": {"version": "8.0.0"},
                "numaNode": {"int": 0},
                "nvlinkClique": {"string": gpu(0).uuid},
            },
            "capacity": {"memory": {"value": "81920Mi"}},
        }
    ]


def test_with_consumable_capacity_a_gpu_is_shared_by_memory_and_cores():
    device = devices(build_slices(NODE, [gpu(0)], Features(True, False), 1))["gpu-0"]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"] == {
        "memory": {
            "value": "81920Mi",
            "requestPolicy": {"default": "81920Mi", "validRange": {"min": "1Mi", "step": "1Mi"}},
        },
        "cores": {
            "value": "100",
            "requestPolicy": {
                "default": "0",
                "validRange": {"min": "0", "max": "100", "step": "1"},
            },
        },
    }


def test_without_consumable_capacity_there_are_no_cores_and_no_shared_allocation():
    device = devices(build_slices(NODE, [gpu(0)], STATIC, 1))["gpu-0"]
    assert "allowMultipleAllocations" not in device
    assert device["capacity"] == {"memory": {"value": "81920Mi"}}


def test_gpus_joined_by_nvlink_share_one_clique_and_others_have_their_own():
    gpus = nvlinked(0, 1) + nvlinked(2, 3) + [gpu(4)]
    cliques = nvlink_cliques(gpus)
    assert cliques[0] == cliques[1] == gpus[0].uuid
    assert cliques[2] == cliques[3] == gpus[2].uuid
    assert cliques[4] == gpu(4).uuid


def test_nvlink_cliques_follow_chains_and_ignore_other_links_and_absent_peers():
    chain = [
        gpu(2, links=(GpuLink(1, LINK_NVLINK, 4),)),
        gpu(1, links=(GpuLink(0, LINK_NVLINK, 4), GpuLink(7, LINK_NVLINK, 4))),
        gpu(0),
    ]
    assert set(nvlink_cliques(chain).values()) == {gpu(0).uuid}


def test_a_mig_gpu_offers_its_instances_only_static_without_partitionable_devices():
    slices = build_slices(NODE, [mig_gpu(1, MIG_3_2_2)], STATIC, 1)
    assert list(devices(slices)) == ["mig-1-0", "mig-1-1", "mig-1-2"]
    assert counter_sets(slices) == {}
    first = devices(slices)["mig-1-0"]
    assert first["attributes"]["type"] == {"string": "mig"}
    assert first["attributes"]["migProfile"] == {"string": "3g.40gb"}
    assert first["attributes"]["parentUUID"] == {"string": gpu(1).uuid}
    assert first["attributes"]["parentIndex"] == {"int": 1}
    assert first["attributes"]["uuid"] == {"string": "MIG-1-0"}
    assert first["capacity"] == {"memory": {"value": "40192Mi"}}
    assert "consumesCounters" not in first and "allowMultipleAllocations" not in first


def test_mig_instances_never_allow_multiple_allocations_even_with_consumable_capacity():
    slices = build_slices(NODE, [mig_gpu(0, MIG_3_2_2)], Features(True, False), 1)
    assert all("allowMultipleAllocations" not in d for d in devices(slices).values())


def test_partitionable_mig_consumes_from_a_counter_set_in_a_slice_of_its_own():
    slices = build_slices(NODE, [gpu(0), mig_gpu(1, MIG_3_2_2)], Features(False, True), 5)
    counter_slice, device_slice = slices
    assert set(counter_slice["spec"]) == {"driver", "nodeName", "pool", "sharedCounters"}
    assert "sharedCounters" not in device_slice["spec"]
    assert counter_slice["spec"]["sharedCounters"] == [
        {
            "name": "gpu-1-counters",
            "counters": {"mig-slices": {"value": "7"}, "memory": {"value": "81920Mi"}},
        }
    ]
    assert devices(slices)["mig-1-1"]["consumesCounters"] == [
        {
            "counterSet": "gpu-1-counters",
            "counters": {"memory": {"value": "19968Mi"}, "mig-slices": {"value": "2"}},
        }
    ]
    assert "consumesCounters" not in devices(slices)["gpu-0"]
    assert [s["spec"]["pool"]["resourceSliceCount"] for s in slices] == [2, 2]
    assert [s["metadata"]["name"] for s in slices] == [
        "node-a-gpu.infergrid.io-0",
        "node-a-gpu.infergrid.io-1",
    ]


def test_counter_names_are_dns_labels_as_the_api_requires():
    assert dra.COUNTER_MIG_SLICES == "mig-slices" and dra.COUNTER_MEMORY == "memory"


def test_a_counter_set_holds_all_existing_instances_even_if_the_table_oversizes_them():
    big = mig_gpu(0, (("4g.40gb", 45000), ("4g.40gb", 45000)))
    [counters] = counter_sets(build_slices(NODE, [big], Features(), 1)).values()
    assert counters["counters"] == {
        "mig-slices": {"value": "8"},
        "memory": {"value": "90000Mi"},
    }


def test_many_devices_split_by_the_api_limits():
    whole = [gpu(i) for i in range(MAX_DEVICES + 2)]
    slices = build_slices(NODE, whole, STATIC, 1)
    assert [len(s["spec"]["devices"]) for s in slices] == [MAX_DEVICES, 2]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    migs = [mig_gpu(i, (("1g.10gb", 9728),) * 7) for i in range(10)]
    slices = build_slices(NODE, migs, Features(), 1)
    assert [len(s["spec"].get("sharedCounters", [])) for s in slices] == [8, 2, 0, 0]
    assert [len(s["spec"].get("devices", [])) for s in slices] == [0, 0, 64, 6]
    assert MAX_DEVICES_CONSUMING_COUNTERS == 64


def test_unhealthy_gpus_and_mig_gpus_without_instances_offer_nothing():
    gpus = [gpu(0, healthy=False), gpu(1, mig_enabled=True), gpu(2)]
    assert list(devices(build_slices(NODE, gpus, Features(), 1))) == ["gpu-2"]
    assert list(node_devices(gpus)) == ["gpu-2"]


def test_a_node_without_gpus_publishes_an_empty_pool():
    [s] = build_slices(NODE, [], Features(), 1)
    assert s["spec"]["devices"] == [] and s["spec"]["pool"]["resourceSliceCount"] == 1


def test_node_devices_map_published_names_to_what_prepare_hands_out():
    table = node_devices([gpu(0), mig_gpu(1, MIG_3_2_2)])
    assert set(table) == {"gpu-0", "mig-1-0", "mig-1-1", "mig-1-2"}
    assert (table["gpu-0"].uuid, table["gpu-0"].memory_mib, table["gpu-0"].mig) == (
        gpu(0).uuid,
        81920,
        False,
    )
    assert (table["mig-1-2"].uuid, table["mig-1-2"].parent_uuid) == ("MIG-1-2", gpu(1).uuid)


@pytest.mark.parametrize(
    "raw, version", [("8.0", "8.0.0"), ("9.0", "9.0.0"), ("12.1", "12.1.0"), ("7", "7.0.0")]
)
def test_compute_capability_is_a_semantic_version(raw, version):
    device = devices(build_slices(NODE, [gpu(0, compute_capability=raw)], STATIC, 1))["gpu-0"]
    assert device["attributes"]["computeCapability"] == {"version": version}


def test_long_strings_are_cut_to_what_an_attribute_holds():
    device = devices(build_slices(NODE, [gpu(0, model="X" * 100)], STATIC, 1))["gpu-0"]
    assert device["attributes"]["model"] == {"string": "X" * 64}


def test_a_long_node_name_still_makes_a_valid_unique_slice_name():
    long_a, long_b = "a" * 250, "a" * 249 + "b"
    assert len(slice_name(long_a, 0)) <= 253
    assert slice_name(long_a, 0) != slice_name(long_b, 0)
    assert slice_name(long_a, 0).endswith("-gpu.infergrid.io-0")


def test_profile_slices_read_from_the_profile_name():
    assert [profile_slices(p) for p in ("1g.10gb", "3g.40gb", "7g.80gb", "1g.10gb+me")] == [
        1,
        3,
        7,
        1,
    ]
    assert profile_slices("odd") is None


def test_dropped_fields_name_the_gate_that_is_off():
    sent = build_slices(NODE, [gpu(0), mig_gpu(1, MIG_3_2_2)], Features(), 1)
    assert dropped_gates(sent, sent) == set()
    stored = build_slices(NODE, [gpu(0), mig_gpu(1, MIG_3_2_2)], STATIC, 1)
    stored.insert(0, {"spec": {}})  # the counter slice, its counters dropped
    assert dropped_gates(sent, stored) == {GATE_CONSUMABLE_CAPACITY, GATE_PARTITIONABLE_DEVICES}
    assert without(Features(), {GATE_CONSUMABLE_CAPACITY}) == Features(False, True)
    assert without(Features(), {GATE_PARTITIONABLE_DEVICES}) == Features(True, False)
