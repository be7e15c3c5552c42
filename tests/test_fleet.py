"""The fleet file: fake GPU nodes for the local cluster and the fake NVML."""

import copy
from pathlib import Path

import pytest

from infergrid.errors import ContractError
from infergrid.fleet import FAKE_ECC, ScheduledEcc, ScheduledXid, load_fleet, parse_fleet
from infergrid.inventory import EccState, node_capacity

SAMPLE = Path(__file__).parent.parent / "e2e" / "fleets" / "sample.yaml"


def a100_node(**changes) -> dict:
    gpus = {
        "model": "NVIDIA A100-SXM4-80GB",
        "count": 8,
        "memoryMiB": 81920,
        "smCount": 108,
        "computeCapability": "8.0",
    }
    return {"name": "a100", "gpus": gpus} | changes


def fleet_of(*nodes: dict) -> dict:
    return {"version": "v1", "nodes": list(nodes)}


def links(node: dict) -> dict[tuple[int, int], tuple[str, int]]:
    (fleet_node,) = parse_fleet(fleet_of(node), "test").nodes
    return {
        (gpu.index, link.peer_index): (link.type, link.count)
        for gpu in fleet_node.inventory.gpus
        for link in gpu.links
    }


def test_the_sample_fleet_loads():
    fleet = load_fleet(SAMPLE)
    names = ["a100-0", "a100-1", "l4-0", "l4-1", "h100", "local-a100"]
    assert [n.name for n in fleet.nodes] == names
    assert [n.name for n in fleet.nodes if n.real] == ["local-a100"]
    capacity = {n.name: node_capacity(n.inventory) for n in fleet.nodes}
    assert capacity["a100-1"] == {
        "nvidia.com/gpu": "7",
        "infergrid.io/vgpu": "70",
        "nvidia.com/mig-3g.40gb": "2",
    }
    assert capacity["l4-0"] == {"nvidia.com/gpu": "4", "infergrid.io/vgpu": "40"}
    assert capacity["h100"] == {"nvidia.com/gpu": "2", "infergrid.io/vgpu": "20"}


def test_defaults_fill_what_the_file_leaves_out():
    (node,) = parse_fleet(fleet_of(a100_node()), "test").nodes
    assert (node.name, node.cpu, node.memory, node.vgpu_slots_per_gpu) == (
        "a100",
        "32",
        "256Gi",
        10,
    )
    gpu = node.inventory.gpus[3]
    assert (gpu.index, gpu.memory_mib, gpu.sm_count, gpu.compute_capability) == (
        3,
        81920,
        108,
        "8.0",
    )
    assert (gpu.numa_node, gpu.healthy, gpu.mig_enabled, gpu.mig_instances) == (0, True, False, ())
    assert node.inventory.node == "a100"


def test_a_count_expands_to_numbered_nodes():
    fleet = parse_fleet(
        fleet_of(a100_node(count=3, cpu="64", memory="1Ti", vgpuSlotsPerGpu=4)), "test"
    )
    assert [n.name for n in fleet.nodes] == ["a100-0", "a100-1", "a100-2"]
    assert {(n.cpu, n.memory, n.vgpu_slots_per_gpu) for n in fleet.nodes} == {("64", "1Ti", 4)}
    assert [n.inventory.node for n in fleet.nodes] == ["a100-0", "a100-1", "a100-2"]


def test_time_slices_default_to_one_and_reach_the_inventory_and_capacity():
    (plain,) = parse_fleet(fleet_of(a100_node()), "test").nodes
    (sliced,) = parse_fleet(fleet_of(a100_node(timeSlices=4)), "test").nodes
    assert (plain.time_slices, sliced.time_slices, sliced.inventory.time_slices) == (1, 4, 4)
    assert node_capacity(sliced.inventory)["nvidia.com/gpu"] == "32"
    with pytest.raises(ContractError, match=r"nodes\[0\]\.timeSlices: must be from 1 to 64"):
        parse_fleet(fleet_of(a100_node(timeSlices=65)), "test")


def test_uuids_are_stable_and_distinct():
    first = parse_fleet(fleet_of(a100_node(count=2, mig={"0": ["1g.10gb"]})), "test")
    again = parse_fleet(fleet_of(a100_node(count=2, mig={"0": ["1g.10gb"]})), "test")
    assert first == again
    uuids = [g.uuid for n in first.nodes for g in n.inventory.gpus]
    assert len(set(uuids)) == 16
    assert all(u.startswith("GPU-") for u in uuids)
    assert first.nodes[0].inventory.gpus[0].mig_instances[0].uuid.startswith("MIG-")


def test_nvlink_all_links_every_pair():
    derived = links(a100_node(topology={"nvlink": "all", "nvlinkCount": 12}))
    assert len(derived) == 8 * 7
    assert set(derived.values()) == {("nvlink", 12)}


def test_without_nvlink_links_follow_switches_then_numa_then_system():
    node = a100_node(topology={"gpusPerSwitch": 2, "numaNodes": 2})
    derived = links(node)
    assert derived[(0, 1)] == ("pcie-switch", 0)
    assert derived[(0, 2)] == ("numa", 0)
    assert derived[(3, 0)] == ("numa", 0)
    assert derived[(0, 4)] == ("system", 0)
    assert derived[(7, 6)] == ("pcie-switch", 0)
    (fleet_node,) = parse_fleet(fleet_of(node), "test").nodes
    assert [g.numa_node for g in fleet_node.inventory.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_nvlink_pairs_link_neighbours_only():
    derived = links(a100_node(topology={"nvlink": "pairs", "nvlinkCount": 4, "gpusPerSwitch": 4}))
    assert derived[(0, 1)] == derived[(1, 0)] == derived[(6, 7)] == ("nvlink", 4)
    assert derived[(1, 2)] == ("pcie-switch", 0)
    assert derived[(3, 4)] == ("numa", 0)


def test_mig_gpus_carry_their_instances_and_unhealthy_gpus_are_marked():
    node = a100_node(mig={"0": ["3g.40gb", "3g.40gb"], 5: [], "7": ["1g.10gb"]}, unhealthy=[3, "7"])
    (fleet_node,) = parse_fleet(fleet_of(node), "test").nodes
    gpus = fleet_node.inventory.gpus
    assert [(m.profile, m.memory_mib, m.sm_count) for m in gpus[0].mig_instances] == [
        ("3g.40gb", 40192, 46),
        ("3g.40gb", 40192, 46),
    ]
    assert [g.index for g in gpus if g.mig_enabled] == [0, 5, 7]
    assert [g.index for g in gpus if not g.healthy] == [3, 7]
    assert node_capacity(fleet_node.inventory) == {
        "nvidia.com/gpu": "4",
        "infergrid.io/vgpu": "40",
        "nvidia.com/mig-3g.40gb": "2",
    }


def test_xid_events_are_scheduled_per_gpu_and_copied_to_every_node_of_a_group():
    events = [
        {"gpu": 0, "xid": 48, "afterSeconds": 5},
        {"gpu": 7, "xid": 32, "afterSeconds": 0.5},
    ]
    nodes = parse_fleet(fleet_of(a100_node(count=2, xidEvents=events)), "test").nodes
    expected = (ScheduledXid(gpu=0, xid=48, after_s=5.0), ScheduledXid(gpu=7, xid=32, after_s=0.5))
    assert [n.xid_events for n in nodes] == [expected, expected]


def test_a_node_without_xid_events_has_none():
    (node,) = parse_fleet(fleet_of(a100_node()), "test").nodes
    assert node.xid_events == ()


def test_ecc_events_set_only_the_values_they_name_and_are_copied_to_every_node_of_a_group():
    events = [
        {"gpu": 1, "afterSeconds": 5, "volatileDoubleBit": 1, "aggregateDoubleBit": 1},
        {"gpu": 0, "afterSeconds": 0, "remapPending": True, "remappedRowsUncorrectable": 2},
    ]
    nodes = parse_fleet(fleet_of(a100_node(count=2, eccEvents=events)), "test").nodes
    expected = (
        ScheduledEcc(1, 5.0, EccState(volatile_double_bit=1, aggregate_double_bit=1)),
        ScheduledEcc(0, 0.0, EccState(remap_pending=True, remapped_rows_uncorrectable=2)),
    )
    assert [n.ecc_events for n in nodes] == [expected, expected]


def test_fake_gpus_start_with_ecc_on_and_nothing_wrong():
    (node,) = parse_fleet(fleet_of(a100_node()), "test").nodes
    assert node.ecc_events == ()
    assert {gpu.ecc for gpu in node.inventory.gpus} == {FAKE_ECC}
    assert FAKE_ECC == EccState(0, 0, 0, False, 0, False, False)


def set_in(path: tuple, value):
    """A change to the valid fleet at ``path``; a value of DELETE removes the key."""

    def change(doc: dict) -> None:
        *parents, last = path
        target = doc
        for key in parents:
            target = target[key]
        if value is DELETE:
            del target[last]
        else:
            target[last] = value

    return change


DELETE = object()
NODE = ("nodes", 0)
GPUS = (*NODE, "gpus")


def xid_event(event: dict):
    """The valid fleet with this one entry in its node's ``xidEvents``."""
    return set_in((*NODE, "xidEvents"), [event])


XID = {"gpu": 0, "xid": 48, "afterSeconds": 1}
XID_NO_GPU = {"xid": 48, "afterSeconds": 1}
XID_NO_XID = {"gpu": 0, "afterSeconds": 1}
XID_NO_TIME = {"gpu": 0, "xid": 48}
XID_AT = "nodes[0].xidEvents[0]"
XID_TIME = XID_AT + ".afterSeconds"


def ecc_event(**changes):
    """The valid fleet with one ``eccEvents`` entry, a valid one with ``changes``."""
    event = {"gpu": 0, "afterSeconds": 1, "volatileDoubleBit": 1} | changes
    return set_in((*NODE, "eccEvents"), [{k: v for k, v in event.items() if v is not DELETE}])


ECC_AT = "nodes[0].eccEvents[0]"

BAD_FLEETS = [
    ("missing version", set_in(("version",), DELETE), "version"),
    ("unknown version", set_in(("version",), "v9"), "version"),
    ("unknown top key", set_in(("node",), []), "node"),
    ("no nodes", set_in(("nodes",), []), "nodes"),
    ("nodes not a list", set_in(("nodes",), {}), "nodes"),
    ("unknown node key", set_in((*NODE, "gpu"), {}), "nodes[0].gpu"),
    ("missing name", set_in((*NODE, "name"), DELETE), "nodes[0].name"),
    ("bad name", set_in((*NODE, "name"), "A100_node"), "nodes[0].name"),
    ("zero count", set_in((*NODE, "count"), 0), "nodes[0].count"),
    ("count as string", set_in((*NODE, "count"), "2"), "nodes[0].count"),
    ("bad cpu", set_in((*NODE, "cpu"), "lots"), "nodes[0].cpu"),
    ("cpu as number", set_in((*NODE, "cpu"), 32), "nodes[0].cpu"),
    ("bad memory", set_in((*NODE, "memory"), "256 GB"), "nodes[0].memory"),
    ("zero slots", set_in((*NODE, "vgpuSlotsPerGpu"), 0), "nodes[0].vgpuSlotsPerGpu"),
    ("missing gpus", set_in((*NODE, "gpus"), DELETE), "nodes[0].gpus"),
    ("unknown gpu key", set_in((*GPUS, "memory"), 1), "nodes[0].gpus.memory"),
    ("missing model", set_in((*GPUS, "model"), DELETE), "nodes[0].gpus.model"),
    ("zero gpus", set_in((*GPUS, "count"), 0), "nodes[0].gpus.count"),
    ("negative memory", set_in((*GPUS, "memoryMiB"), -1), "nodes[0].gpus.memoryMiB"),
    ("memory as boolean", set_in((*GPUS, "memoryMiB"), True), "nodes[0].gpus.memoryMiB"),
    ("missing sms", set_in((*GPUS, "smCount"), DELETE), "nodes[0].gpus.smCount"),
    (
        "capability as number",
        set_in((*GPUS, "computeCapability"), 8.0),
        "nodes[0].gpus.computeCapability",
    ),
    (
        "unknown topology key",
        set_in((*NODE, "topology"), {"nvlinks": "all"}),
        "nodes[0].topology.nvlinks",
    ),
    (
        "bad nvlink mode",
        set_in((*NODE, "topology"), {"nvlink": "some"}),
        "nodes[0].topology.nvlink",
    ),
    (
        "zero numa nodes",
        set_in((*NODE, "topology"), {"numaNodes": 0}),
        "nodes[0].topology.numaNodes",
    ),
    (
        "zero per switch",
        set_in((*NODE, "topology"), {"gpusPerSwitch": 0}),
        "nodes[0].topology.gpusPerSwitch",
    ),
    ("mig not a map", set_in((*NODE, "mig"), ["1g.10gb"]), "nodes[0].mig"),
    ("mig index out of range", set_in((*NODE, "mig"), {"8": []}), "nodes[0].mig[8]"),
    ("mig index not a number", set_in((*NODE, "mig"), {"first": []}), "nodes[0].mig.first"),
    ("mig gpu twice", set_in((*NODE, "mig"), {"0": [], 0: []}), "nodes[0].mig[0]"),
    ("mig profiles not a list", set_in((*NODE, "mig"), {"0": "1g.10gb"}), "nodes[0].mig[0]"),
    (
        "unknown mig profile",
        set_in((*NODE, "mig"), {"1": ["1g.10gb", "1g.5gb"]}),
        "nodes[0].mig[1][1]",
    ),
    ("too many slices", set_in((*NODE, "mig"), {"0": ["4g.40gb", "4g.40gb"]}), "nodes[0].mig[0]"),
    ("too much memory", set_in((*NODE, "mig"), {"0": ["1g.20gb"] * 5}), "nodes[0].mig[0]"),
    ("unhealthy out of range", set_in((*NODE, "unhealthy"), [1, 8]), "nodes[0].unhealthy[1]"),
    ("unhealthy negative", set_in((*NODE, "unhealthy"), [-1]), "nodes[0].unhealthy[0]"),
    ("unhealthy as boolean", set_in((*NODE, "unhealthy"), [True]), "nodes[0].unhealthy[0]"),
    ("unknown kubelet", set_in((*NODE, "kubelet"), "kind"), "nodes[0].kubelet"),
    ("xid events not a list", set_in((*NODE, "xidEvents"), {"gpu": 0}), "nodes[0].xidEvents"),
    ("xid event not a map", set_in((*NODE, "xidEvents"), [48]), "nodes[0].xidEvents[0]"),
    ("unknown xid event key", xid_event(XID | {"at": 1}), XID_AT + ".at"),
    ("xid event without gpu", xid_event(XID_NO_GPU), XID_AT + ".gpu"),
    ("xid event gpu out of range", xid_event(XID | {"gpu": 8}), XID_AT + ".gpu"),
    ("xid event gpu as string", xid_event(XID | {"gpu": "0"}), XID_AT + ".gpu"),
    ("xid event without xid", xid_event(XID_NO_XID), XID_AT + ".xid"),
    ("xid zero", xid_event(XID | {"xid": 0}), XID_AT + ".xid"),
    ("xid as boolean", xid_event(XID | {"xid": True}), XID_AT + ".xid"),
    ("xid event without time", xid_event(XID_NO_TIME), XID_TIME),
    ("xid event in the past", xid_event(XID | {"afterSeconds": -1}), XID_TIME),
    ("xid event time as string", xid_event(XID | {"afterSeconds": "5s"}), XID_TIME),
    ("xid event time infinite", xid_event(XID | {"afterSeconds": float("inf")}), XID_TIME),
    ("xid event time as boolean", xid_event(XID | {"afterSeconds": True}), XID_TIME),
    ("kubelet as boolean", set_in((*NODE, "kubelet"), True), "nodes[0].kubelet"),
    ("ecc events not a list", set_in((*NODE, "eccEvents"), {"gpu": 0}), "nodes[0].eccEvents"),
    ("ecc event not a map", set_in((*NODE, "eccEvents"), [1]), ECC_AT),
    ("unknown ecc event key", ecc_event(doubleBit=1), ECC_AT + ".doubleBit"),
    ("ecc event without gpu", ecc_event(gpu=DELETE), ECC_AT + ".gpu"),
    ("ecc event gpu out of range", ecc_event(gpu=8), ECC_AT + ".gpu"),
    ("ecc event without time", ecc_event(afterSeconds=DELETE), ECC_AT + ".afterSeconds"),
    ("ecc event in the past", ecc_event(afterSeconds=-1), ECC_AT + ".afterSeconds"),
    ("ecc event setting nothing", ecc_event(volatileDoubleBit=DELETE), ECC_AT),
    ("ecc count negative", ecc_event(volatileDoubleBit=-1), ECC_AT + ".volatileDoubleBit"),
    ("ecc count as boolean", ecc_event(aggregateDoubleBit=True), ECC_AT + ".aggregateDoubleBit"),
    ("ecc flag as integer", ecc_event(remapPending=1), ECC_AT + ".remapPending"),
]


def test_a_real_node_takes_the_machines_cpu_and_memory():
    node = a100_node(kubelet="real")
    (parsed,) = parse_fleet(fleet_of(node), "f.yaml").nodes
    assert parsed.real
    for key in ("cpu", "memory"):
        with pytest.raises(ContractError) as raised:
            parse_fleet(fleet_of({**node, key: "8"}), "f.yaml")
        assert raised.value.field == f"nodes[0].{key}"
        assert "machine's own" in raised.value.reason


@pytest.mark.parametrize(
    ("change", "field"), [c[1:] for c in BAD_FLEETS], ids=[c[0] for c in BAD_FLEETS]
)
def test_bad_fleets_are_refused_naming_the_field_and_the_file(change, field):
    doc = copy.deepcopy(fleet_of(a100_node()))
    change(doc)
    with pytest.raises(ContractError) as raised:
        parse_fleet(doc, "fleets/x.yaml")
    assert raised.value.field == field
    assert raised.value.reason.endswith("(in fleets/x.yaml)")


def test_mig_on_a_gpu_without_mig_is_refused():
    l4 = a100_node(mig={"0": ["1g.5gb"]})
    l4["gpus"] |= {"model": "NVIDIA L4", "memoryMiB": 23034}
    with pytest.raises(ContractError, match="no known MIG profiles") as raised:
        parse_fleet(fleet_of(l4), "test")
    assert raised.value.field == "nodes[0].mig[0][0]"


def test_node_names_must_be_unique_after_expansion():
    with pytest.raises(ContractError, match="'a100-1'") as raised:
        parse_fleet(fleet_of(a100_node(count=2), a100_node(name="a100-1")), "test")
    assert raised.value.field == "nodes[1].name"


@pytest.mark.parametrize("data", [None, [], "nodes"])
def test_a_document_that_is_not_a_mapping_is_refused(data):
    with pytest.raises(ContractError) as raised:
        parse_fleet(data, "test")
    assert raised.value.field == "fleet"


def test_unreadable_and_malformed_files_name_the_file(tmp_path):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ContractError, match="cannot read") as raised:
        load_fleet(missing)
    assert raised.value.field == str(missing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("nodes: [a, b\n")
    with pytest.raises(ContractError, match="not valid YAML") as raised:
        load_fleet(broken)
    assert raised.value.field == str(broken)
