"""Allocate decisions on plain data: matching, and never over-committing a GPU."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from device_plugin.allocator import AllocationError, grant
from device_plugin.config import PluginConfig
from device_plugin.devices import by_id, resource_devices
from device_plugin.ledger import Ledger
from infergrid.assignment_annotation import PodAssignment, encode_assignment
from infergrid.constants import ANNOTATION_GPU_ASSIGNMENT, SCHEDULER_NAME
from infergrid.fleet import parse_fleet
from infergrid.placement import build_node_state, idle_usage
from infergrid.records import pod_record
from tests.device_plugin.conftest import T0, mig, pod, share, whole
from tests.placement.builders import gpu, inventory

FLEET = parse_fleet(
    {
        "version": "v1",
        "nodes": [
            {
                "name": "n",
                "gpus": {
                    "model": "NVIDIA L4",
                    "count": 2,
                    "memoryMiB": 1000,
                    "smCount": 58,
                    "computeCapability": "8.9",
                },
            }
        ],
    },
    "test",
)
INVENTORY = FLEET.nodes[0].inventory
CONFIG = PluginConfig(node_name="n", vgpu_slots_per_gpu=4)
DEVICES = by_id(resource_devices(INVENTORY, CONFIG, lambda uuid: True))
UUIDS = [g.uuid for g in INVENTORY.gpus]


def device_ids(container) -> list[str]:
    if container.shared:
        return [f"{container.gpus[0].uuid}::vgpu-0"]
    return [g.uuid for g in container.gpus]


containers = st.one_of(
    st.builds(
        lambda gpu, mem, cores: share("c", UUIDS[gpu], mem, cores),
        st.integers(0, 1),
        st.integers(1, 1200),
        st.integers(1, 100),
    ),
    st.builds(lambda gpu: whole("c", UUIDS[gpu], memory=1000), st.integers(0, 1)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(containers, min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_honoured_assignments_never_over_commit_a_gpu(assigned, rnd):
    pods = [pod(f"p{i}", "n", c, age_s=i) for i, c in enumerate(assigned)]
    ledger = Ledger()
    order = list(range(len(pods)))
    rnd.shuffle(order)
    for i in order:
        try:
            grant(device_ids(assigned[i]), DEVICES, "n", pods, ledger, CONFIG)
        except AllocationError:
            pass
        for uuid, load in tally(ledger).items():
            assert load["memory"] <= 1000 and load["cores"] <= 100
            assert not (load["whole"] and load["shares"]), uuid
            assert not load["whole"] or load["memory"] == 1000


def tally(ledger: Ledger) -> dict[str, Counter]:
    """What the granted containers count for on each GPU, summed apart from the code under test."""
    loads: dict[str, Counter] = {}
    for c in ledger.charged():
        for g in c.gpus:
            loads.setdefault(g.uuid, Counter()).update(
                memory=g.memory_mib, cores=g.cores, whole=not c.shared, shares=c.shared
            )
    return loads


@settings(max_examples=300, deadline=None)
@given(st.lists(containers, max_size=8), containers)
def test_the_gate_admits_exactly_what_the_placement_core_would_place(held, asked):
    """Whatever was granted before, Allocate honours an assignment exactly when the
    extender's placers would have offered its GPU on a node holding those grants."""
    ledger = Ledger({(f"uid-held-{i}", c.name): c for i, c in enumerate(held)})
    try:
        grant(device_ids(asked), DEVICES, "n", [pod("asker", "n", asked)], ledger, CONFIG)
        granted = True
    except AllocationError as refusal:
        granted = False
        assert asked.gpus[0].uuid in str(refusal)
    inventory = replace(INVENTORY, share_slots=CONFIG.vgpu_slots_per_gpu)
    recorded = PodAssignment("n", T0, tuple(held))
    node = build_node_state(inventory, idle_usage(inventory, T0), [recorded], T0, timedelta(0))
    (gpu,) = (g for g in node.gpus if g.uuid == asked.gpus[0].uuid)
    mib, cores = asked.gpus[0].memory_mib, asked.gpus[0].cores
    assert granted == (gpu.takes_share(mib, cores) if asked.shared else gpu.takes_whole())


def test_a_refused_request_leaves_the_ledger_unchanged():
    pods = [
        pod("a", "n", whole("c", UUIDS[0], memory=1000)),
        pod("b", "n", share("c", UUIDS[0], 10)),
    ]
    ledger = Ledger()
    grant([UUIDS[0]], DEVICES, "n", pods, ledger, CONFIG)
    before = dict(ledger.honoured)
    with pytest.raises(AllocationError, match="held whole"):
        grant([f"{UUIDS[0]}::vgpu-1"], DEVICES, "n", pods, ledger, CONFIG)
    assert ledger.honoured == before


def test_only_pods_of_the_configured_scheduler_get_gpus():
    """A chart that renames the scheduler renames it for the plugin too."""
    config = replace(CONFIG, scheduler_name="infergrid-chart")
    ours = [pod("a", "n", whole("c", UUIDS[0], memory=1000), scheduler="infergrid-chart")]
    assert grant([UUIDS[0]], DEVICES, "n", ours, Ledger(), config).pending.pod.key == "default/a"
    stock = [pod("a", "n", whole("c", UUIDS[0], memory=1000))]
    with pytest.raises(AllocationError, match="was not scheduled by infergrid-chart"):
        grant([UUIDS[0]], DEVICES, "n", stock, Ledger(), config)


def test_an_older_pod_of_another_scheduler_does_not_stand_in_front_of_ours():
    rogue = pod("rogue", "n", whole("c", UUIDS[0], memory=1000), scheduler="default-scheduler")
    ours = pod("ours", "n", whole("c", UUIDS[0], memory=1000), age_s=5)
    granted = grant([UUIDS[0]], DEVICES, "n", [rogue, ours], Ledger(), CONFIG)
    assert granted.pending.pod.key == "default/ours"


def test_a_malformed_assignment_is_refused_with_its_decode_error():
    """The kubelet puts the refusal in the pod's events: the owner sees which field is wrong."""
    text = encode_assignment(pod("bad", "n", whole("c", UUIDS[0], memory=1000)).assignment)
    doc = json.loads(text)
    doc["containers"][0]["gpus"][0]["memoryMiB"] = -5
    bad = pod_record(
        {
            "metadata": {
                "uid": "u",
                "namespace": "team",
                "name": "bad",
                "annotations": {ANNOTATION_GPU_ASSIGNMENT: json.dumps(doc)},
            },
            "spec": {"nodeName": "n", "schedulerName": SCHEDULER_NAME},
        }
    )
    with pytest.raises(AllocationError) as refused:
        grant([UUIDS[0]], DEVICES, "n", [bad], Ledger(), CONFIG)
    assert str(refused.value).endswith(
        "assignments that do not decode: team/bad: "
        f"{ANNOTATION_GPU_ASSIGNMENT}: containers[0].gpus[0].memoryMiB: must be at least 1, got -5"
    )


def test_pods_that_leave_free_their_gpus():
    held = pod("a", "n", whole("c", UUIDS[1], memory=1000))
    ledger = Ledger()
    grant([UUIDS[1]], DEVICES, "n", [held], ledger, CONFIG)
    ledger.keep_only([])
    later = pod("b", "n", whole("c", UUIDS[1], memory=1000), age_s=5)
    grant([UUIDS[1]], DEVICES, "n", [later], ledger, CONFIG)
    assert list(ledger.honoured) == [("uid-b", "c")]


def test_a_restarted_plugin_adopts_allocations_marked_in_annotations():
    done = pod("a", "n", replace(whole("c", UUIDS[0], memory=1000), allocated=True))
    ledger = Ledger()
    ledger.seed([done])
    rival = pod("b", "n", share("c", UUIDS[0], 10), age_s=3)
    with pytest.raises(AllocationError, match="held whole"):
        grant([f"{UUIDS[0]}::vgpu-0"], DEVICES, "n", [done, rival], ledger, CONFIG)


def test_a_mig_instance_is_given_out_once():
    a100 = inventory(gpu(0, memory=81920, model="NVIDIA A100", mig=("3g.40gb", "3g.40gb")))
    devices = by_id(resource_devices(a100, CONFIG, lambda uuid: True))
    first, second = (pod(n, a100.node, mig("c", "MIG-0-0", "3g.40gb", "GPU-0")) for n in "ab")
    ledger = Ledger()
    grant(["MIG-0-0"], devices, a100.node, [first, second], ledger, CONFIG)
    with pytest.raises(AllocationError, match="MIG instance MIG-0-0 is already taken"):
        grant(["MIG-0-0"], devices, a100.node, [first, second], ledger, CONFIG)
