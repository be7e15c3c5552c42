"""The node GPU inventory annotation, and the labels and capacity derived from it."""

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infergrid.constants import LINK_NVLINK, LINK_TYPES
from infergrid.errors import ContractError
from infergrid.gpu_models import label_value
from infergrid.inventory import (
    EccState,
    Gpu,
    GpuInventory,
    GpuLink,
    MigInstance,
    decode_inventory,
    encode_inventory,
    node_capacity,
    node_labels,
)

names = st.text(min_size=1, max_size=12)
sizes = st.integers(0, 2**40)
mig_instances = st.builds(MigInstance, profile=names, uuid=names, memory_mib=sizes, sm_count=sizes)
capabilities = st.tuples(st.integers(0, 20), st.integers(0, 9)).map(lambda t: f"{t[0]}.{t[1]}")
counts, flags = st.none() | st.integers(0, 2**40), st.none() | st.booleans()
eccs = st.builds(EccState, counts, counts, counts, flags, counts, flags, flags)


def links_to(peer: int) -> st.SearchStrategy[GpuLink]:
    nvlink = st.builds(GpuLink, st.just(peer), st.just(LINK_NVLINK), st.integers(1, 18))
    other = st.builds(GpuLink, st.just(peer), st.sampled_from(LINK_TYPES[1:]), st.just(0))
    return nvlink | other


@st.composite
def inventories(draw: st.DrawFn) -> GpuInventory:
    indices = draw(st.lists(st.integers(0, 63), unique=True, max_size=5))
    uuids = draw(st.lists(names, unique=True, min_size=len(indices), max_size=len(indices)))
    gpus = []
    for index, uuid in zip(indices, uuids, strict=True):
        mig_enabled = draw(st.booleans())
        peers = draw(st.lists(st.sampled_from(indices), unique=True)) if len(indices) > 1 else []
        gpus.append(
            Gpu(
                uuid=uuid,
                index=index,
                model=draw(names),
                memory_mib=draw(sizes),
                sm_count=draw(sizes),
                compute_capability=draw(capabilities),
                numa_node=draw(st.integers(0, 7)),
                healthy=draw(st.booleans()),
                mig_enabled=mig_enabled,
                mig_instances=tuple(draw(st.lists(mig_instances, max_size=3)))
                if mig_enabled
                else (),
                links=tuple(draw(links_to(p)) for p in peers if p != index),
                ecc=draw(st.none() | eccs),
            )
        )
    time_slices = draw(st.sampled_from((1, 1, 2, 64)))
    return GpuInventory(node=draw(names), gpus=tuple(gpus), time_slices=time_slices)


@given(inventories())
def test_encode_then_decode_gives_the_same_inventory(inventory):
    assert decode_inventory(encode_inventory(inventory)) == inventory


def test_encoding_is_versioned_compact_camel_case_json():
    inventory = GpuInventory("n", (a100(0),))
    doc = json.loads(encode_inventory(inventory))
    assert doc["version"] == "v1"
    assert set(doc["gpus"][0]) == {
        "uuid",
        "index",
        "model",
        "memoryMiB",
        "smCount",
        "computeCapability",
        "numaNode",
        "healthy",
        "mig",
        "links",
    }
    assert " " not in encode_inventory(GpuInventory("n", ()))


def a100(index: int, **changes) -> Gpu:
    fields = {
        "uuid": f"GPU-{index}",
        "index": index,
        "model": "NVIDIA A100-SXM4-80GB",
        "memory_mib": 81920,
        "sm_count": 108,
        "compute_capability": "8.0",
        "numa_node": 0,
        "healthy": True,
    }
    return Gpu(**(fields | changes))


A100_ECC = EccState(0, 0, None, None, 0, False, False)
"""An A100's ECC record with nothing wrong: it remaps rows and retires no pages."""


def valid_doc() -> dict:
    mig = (MigInstance("3g.40gb", "MIG-0", 40192, 46),)
    gpus = (
        a100(0, mig_enabled=True, mig_instances=mig, links=(GpuLink(1, "nvlink", 12),)),
        a100(1, links=(GpuLink(0, "nvlink", 12),)),
    )
    gpus = (replace(gpus[0], ecc=A100_ECC), gpus[1])
    return json.loads(encode_inventory(GpuInventory("node-a", gpus)))


ECC = "gpus[0].ecc"


def ecc_of(doc: dict) -> dict:
    return doc["gpus"][0]["ecc"]


def ecc_set(key: str, value: object):
    return lambda doc: ecc_of(doc).update({key: value})


BAD_DOCS = [
    ("missing version", lambda d: d.pop("version"), "version"),
    ("unknown version", lambda d: d.update(version="v2"), "version"),
    ("missing node", lambda d: d.pop("node"), "node"),
    ("empty node", lambda d: d.update(node=""), "node"),
    ("gpus not a list", lambda d: d.update(gpus={}), "gpus"),
    ("gpu not an object", lambda d: d["gpus"].append(3), "gpus[2]"),
    ("missing memory", lambda d: d["gpus"][1].pop("memoryMiB"), "gpus[1].memoryMiB"),
    ("negative memory", lambda d: d["gpus"][1].update(memoryMiB=-1), "gpus[1].memoryMiB"),
    ("memory as string", lambda d: d["gpus"][1].update(memoryMiB="80"), "gpus[1].memoryMiB"),
    ("memory as float", lambda d: d["gpus"][1].update(memoryMiB=1.5), "gpus[1].memoryMiB"),
    ("index as boolean", lambda d: d["gpus"][0].update(index=True), "gpus[0].index"),
    ("healthy as integer", lambda d: d["gpus"][0].update(healthy=1), "gpus[0].healthy"),
    (
        "bad capability",
        lambda d: d["gpus"][0].update(computeCapability="8"),
        "gpus[0].computeCapability",
    ),
    ("missing numa node", lambda d: d["gpus"][0].pop("numaNode"), "gpus[0].numaNode"),
    ("duplicate index", lambda d: d["gpus"][1].update(index=0), "gpus[1].index"),
    ("duplicate uuid", lambda d: d["gpus"][1].update(uuid="GPU-0"), "gpus[1].uuid"),
    ("missing mig", lambda d: d["gpus"][0].pop("mig"), "gpus[0].mig"),
    ("mig enabled missing", lambda d: d["gpus"][0]["mig"].pop("enabled"), "gpus[0].mig.enabled"),
    (
        "instances without mig mode",
        lambda d: d["gpus"][0]["mig"].update(enabled=False),
        "gpus[0].mig.instances",
    ),
    (
        "instance without uuid",
        lambda d: d["gpus"][0]["mig"]["instances"][0].pop("uuid"),
        "gpus[0].mig.instances[0].uuid",
    ),
    (
        "unknown link type",
        lambda d: d["gpus"][0]["links"][0].update(type="pcie"),
        "gpus[0].links[0].type",
    ),
    (
        "nvlink with no links",
        lambda d: d["gpus"][0]["links"][0].update(count=0),
        "gpus[0].links[0].count",
    ),
    (
        "numa link with a count",
        lambda d: d["gpus"][0]["links"][0].update(type="numa"),
        "gpus[0].links[0].count",
    ),
    ("link to itself", lambda d: d["gpus"][0]["links"][0].update(peer=0), "gpus[0].links[0].peer"),
    ("link to no gpu", lambda d: d["gpus"][0]["links"][0].update(peer=9), "gpus[0].links[0].peer"),
    (
        "two links to one peer",
        lambda d: d["gpus"][0]["links"].append(d["gpus"][0]["links"][0]),
        "gpus[0].links[1].peer",
    ),
    ("ecc not an object", lambda d: d["gpus"][0].update(ecc=[]), "gpus[0].ecc"),
    ("ecc count negative", ecc_set("volatileDoubleBit", -1), ECC + ".volatileDoubleBit"),
    ("ecc count as boolean", ecc_set("aggregateDoubleBit", True), ECC + ".aggregateDoubleBit"),
    ("ecc count as string", ecc_set("retiredPagesDoubleBit", "2"), ECC + ".retiredPagesDoubleBit"),
    ("ecc flag as integer", ecc_set("remapPending", 1), ECC + ".remapPending"),
    ("ecc flag as string", ecc_set("remapFailed", "no"), ECC + ".remapFailed"),
    ("no time slices", lambda d: d.update(timeSlices=0), "timeSlices"),
    ("too many time slices", lambda d: d.update(timeSlices=65), "timeSlices"),
    ("time slices as string", lambda d: d.update(timeSlices="2"), "timeSlices"),
]


@pytest.mark.parametrize(
    ("mutate", "field"), [c[1:] for c in BAD_DOCS], ids=[c[0] for c in BAD_DOCS]
)
def test_bad_documents_are_refused_naming_the_field(mutate, field):
    doc = valid_doc()
    mutate(doc)
    with pytest.raises(ContractError) as raised:
        decode_inventory(json.dumps(doc))
    assert raised.value.field == field


@pytest.mark.parametrize("text", ["", "not json", "[]", '"v1"', "null"])
def test_text_that_is_not_a_json_object_is_refused(text):
    with pytest.raises(ContractError) as raised:
        decode_inventory(text)
    assert raised.value.field == "infergrid.io/gpu-inventory"


def test_the_valid_document_decodes():
    assert decode_inventory(json.dumps(valid_doc())).node == "node-a"


def test_ecc_values_nvml_does_not_support_are_left_out_and_read_back_as_none():
    doc = valid_doc()
    assert ecc_of(doc) == {
        "volatileDoubleBit": 0,
        "aggregateDoubleBit": 0,
        "remappedRowsUncorrectable": 0,
        "remapPending": False,
        "remapFailed": False,
    }
    ecc_of(doc).update(retiredPagesDoubleBit=None, remapFailed=None)
    assert decode_inventory(json.dumps(doc)).gpus[0].ecc == replace(A100_ECC, remap_failed=None)
    assert "ecc" not in doc["gpus"][1]
    assert decode_inventory(json.dumps(doc)).gpus[1].ecc is None


def test_an_inventory_written_before_ecc_was_published_still_decodes():
    doc = valid_doc()
    del doc["gpus"][0]["ecc"]
    assert [gpu.ecc for gpu in decode_inventory(json.dumps(doc)).gpus] == [None, None]


def test_capacity_counts_healthy_whole_gpus_slots_and_mig_instances():
    migs = tuple(MigInstance("3g.40gb", f"MIG-{n}", 40192, 46) for n in range(2))
    inventory = GpuInventory(
        "n",
        (
            a100(0, mig_enabled=True, mig_instances=migs),
            a100(1),
            a100(2),
            a100(3, healthy=False),
            a100(4, healthy=False, mig_enabled=True, mig_instances=migs),
        ),
    )
    assert node_capacity(replace(inventory, share_slots=4)) == {
        "nvidia.com/gpu": "2",
        "infergrid.io/vgpu": "8",
        "nvidia.com/mig-3g.40gb": "2",
    }


def test_time_slices_are_published_only_above_one_so_older_inventories_still_decode():
    doc = valid_doc()
    assert "timeSlices" not in doc and decode_inventory(json.dumps(doc)).time_slices == 1
    sliced = replace(decode_inventory(json.dumps(doc)), time_slices=4)
    assert json.loads(encode_inventory(sliced))["timeSlices"] == 4


def test_capacity_offers_each_whole_gpu_once_per_time_slice():
    migs = (MigInstance("3g.40gb", "MIG-0", 40192, 46),)
    gpus = (a100(0, mig_enabled=True, mig_instances=migs), a100(1), a100(2, healthy=False))
    assert node_capacity(GpuInventory("n", gpus, share_slots=4, time_slices=3)) == {
        "nvidia.com/gpu": "3",
        "infergrid.io/vgpu": "4",
        "nvidia.com/mig-3g.40gb": "1",
    }


def test_capacity_uses_the_default_slots_and_advertises_zero_gpus():
    assert node_capacity(GpuInventory("n", ())) == {"nvidia.com/gpu": "0", "infergrid.io/vgpu": "0"}
    assert node_capacity(GpuInventory("n", (a100(0),)))["infergrid.io/vgpu"] == "10"


def test_labels_describe_the_gpus():
    inventory = GpuInventory("n", (a100(1), a100(0, memory_mib=1000)))
    assert node_labels(inventory) == {
        "infergrid.io/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "infergrid.io/gpu.model": "a100-80gb",
        "infergrid.io/gpu.count": "2",
        "infergrid.io/gpu.memory": "1000",
        "infergrid.io/gpu.compute-capability": "8.0",
        "infergrid.io/gpu.compute-level": "80",
        "infergrid.io/gpu.mixed": "false",
        "infergrid.io/mig.capable": "true",
    }


def test_a_node_with_several_models_is_labelled_mixed_with_its_highest_compute_level():
    t4 = a100(0, model="Tesla T4", memory_mib=15360, compute_capability="7.5")
    h100 = a100(1, model="NVIDIA H100 80GB HBM3", memory_mib=81559, compute_capability="9.0")
    labels = node_labels(GpuInventory("n", (h100, t4)))
    assert labels["infergrid.io/gpu.model"] == "t4-16gb"  # the lowest index names the node
    assert labels["infergrid.io/gpu.compute-capability"] == "7.5"
    assert labels["infergrid.io/gpu.compute-level"] == "90"
    assert labels["infergrid.io/gpu.mixed"] == "true"


def test_gpus_outside_the_mig_table_are_not_mig_capable_unless_in_mig_mode():
    l4 = a100(0, model="NVIDIA L4", memory_mib=23034)
    assert node_labels(GpuInventory("n", (l4,)))["infergrid.io/mig.capable"] == "false"
    enabled = a100(0, model="Some GPU", mig_enabled=True)
    assert node_labels(GpuInventory("n", (enabled,)))["infergrid.io/mig.capable"] == "true"


def test_labels_of_a_node_without_gpus():
    assert node_labels(GpuInventory("n", ())) == {
        "infergrid.io/gpu.product": "",
        "infergrid.io/gpu.model": "",
        "infergrid.io/gpu.count": "0",
        "infergrid.io/gpu.memory": "0",
        "infergrid.io/gpu.compute-capability": "",
        "infergrid.io/gpu.compute-level": "0",
        "infergrid.io/gpu.mixed": "false",
        "infergrid.io/mig.capable": "false",
    }


@pytest.mark.parametrize(
    ("model", "value"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("Tesla V100 (SXM2) 16GB", "Tesla-V100--SXM2--16GB"),
        (" weird/name. ", "weird-name"),
        ("x" * 80, "x" * 63),
    ],
)
def test_product_label_is_a_valid_label_value(model, value):
    assert label_value(model) == value
