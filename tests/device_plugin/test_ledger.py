"""Who holds a grant: provisional while several pods could, exact once the kubelet says.

The kubelet's Allocate names devices, not pods, and it admits pods in its own
order; its PodResources API says afterwards which pod's container holds which
devices. Until then the ledger charges the largest candidate and the container
is limited to the smallest, so nothing is over-committed whatever the truth.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from device_plugin.allocator import AllocationError, grant
from device_plugin.config import PluginConfig
from device_plugin.devices import by_id, resource_devices
from device_plugin.holdings import Held
from device_plugin.ledger import Ledger, pending_on
from infergrid.constants import RESOURCE_GPU, RESOURCE_VGPU
from infergrid.placement import recheck
from tests.device_plugin.conftest import pod, share, whole
from tests.device_plugin.test_allocator import INVENTORY, UUIDS

CONFIG = PluginConfig(node_name="n", vgpu_slots_per_gpu=4, mps=True)
DEVICES = by_id(resource_devices(INVENTORY, CONFIG, lambda uuid: True))
G0 = UUIDS[0]


def slot(k: int, uuid: str = G0) -> str:
    return f"{uuid}::vgpu-{k}"


def held(name: str, *ids: str, resource: str = RESOURCE_VGPU, container: str = "c") -> Held:
    return Held("default", name, container, resource, frozenset(ids))


def memory_on(ledger: Ledger, uuid: str) -> int:
    return sum(g.memory_mib for c in ledger.charged() for g in c.gpus if g.uuid == uuid)


SMALL = pod("small", "n", share("c", G0, 200, cores=20), age_s=1)
LARGE = pod("large", "n", share("c", G0, 400, cores=40), age_s=2)


def test_a_grant_two_pods_could_explain_charges_the_larger_and_limits_to_the_smaller():
    ledger = Ledger()
    granted = grant([slot(0)], DEVICES, "n", [SMALL, LARGE], ledger, CONFIG)
    assert memory_on(ledger, G0) == 400
    assert granted.envs["INFERGRID_GPU_MEMORY_MIB"] == "200"
    assert granted.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=200M"
    assert granted.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
    assert [c.pod.name for c in granted.candidates] == ["small", "large"]
    assert granted.pending.pod.name == "small"  # the guess: the oldest assignment


def test_equal_candidates_change_nothing():
    twins = [pod(n, "n", share("c", G0, 300, cores=30), age_s=i) for i, n in enumerate("ab")]
    ledger = Ledger()
    granted = grant([slot(0)], DEVICES, "n", twins, ledger, CONFIG)
    assert memory_on(ledger, G0) == 300
    assert granted.envs["INFERGRID_GPU_MEMORY_MIB"] == "300"


def test_once_the_kubelet_shows_the_holder_the_ledger_holds_exactly_it():
    """Admitted in the order opposite to assignedAt: each device ends with its own pod."""
    pods = [SMALL, LARGE]
    ledger = Ledger()
    grant([slot(0)], DEVICES, "n", pods, ledger, CONFIG)  # the kubelet admits `large` first
    ledger.confirm([held("large", slot(0))], pods, DEVICES)
    assert ledger.honoured == {("uid-large", "c"): LARGE.assignment.containers[0]}
    assert ledger.provisional == {}
    second = grant([slot(1)], DEVICES, "n", pods, ledger, CONFIG)
    assert second.envs["INFERGRID_GPU_MEMORY_MIB"] == "200"  # only `small` is left to explain it
    assert set(ledger.honoured) == {("uid-large", "c"), ("uid-small", "c")}
    assert memory_on(ledger, G0) == 600


def test_freeing_a_pod_frees_its_own_share():
    pods = [SMALL, LARGE]
    ledger = Ledger()
    grant([slot(0)], DEVICES, "n", pods, ledger, CONFIG)
    grant([slot(1)], DEVICES, "n", pods, ledger, CONFIG)
    ledger.confirm([held("large", slot(0)), held("small", slot(1))], pods, DEVICES)
    ledger.confirm([held("small", slot(1))], pods, DEVICES)  # `large` ended
    assert list(ledger.honoured) == [("uid-small", "c")]
    assert memory_on(ledger, G0) == 200


def test_a_candidate_shown_elsewhere_leaves_the_other_as_the_holder():
    pods = [SMALL, LARGE]
    ledger = Ledger()
    grant([slot(0)], DEVICES, "n", pods, ledger, CONFIG)
    grant([slot(1)], DEVICES, "n", pods, ledger, CONFIG)
    assert memory_on(ledger, G0) == 800  # two grants, each charged the larger
    ledger.confirm([held("small", slot(1))], pods, DEVICES)
    assert set(ledger.honoured) == {("uid-small", "c"), ("uid-large", "c")}
    assert memory_on(ledger, G0) == 600


def test_when_grants_account_for_every_candidate_a_further_request_is_refused():
    pods = [SMALL, LARGE]
    ledger = Ledger()
    grant([slot(0)], DEVICES, "n", pods, ledger, CONFIG)
    grant([slot(1)], DEVICES, "n", pods, ledger, CONFIG)
    with pytest.raises(AllocationError, match="is already granted"):
        grant([slot(2)], DEVICES, "n", pods, ledger, CONFIG)


def test_a_rebuilt_ledger_refuses_an_over_commit_its_lost_marks_would_have_let_through():
    """A plugin restart with every `allocated` mark lost: the kubelet still knows."""
    running = pod("running", "n", share("c", G0, 800))
    newcomer = pod("newcomer", "n", share("c", G0, 800), age_s=5)
    ledger = Ledger()
    ledger.rebuild([held("running", slot(3))], [running, newcomer], DEVICES)
    assert list(ledger.honoured) == [("uid-running", "c")]
    with pytest.raises(AllocationError, match="MiB free, needs"):
        grant([slot(0)], DEVICES, "n", [running, newcomer], ledger, CONFIG)
    seeded = Ledger()
    seeded.seed([running, newcomer])  # what the marks alone say: nothing
    assert grant([slot(0)], DEVICES, "n", [running, newcomer], seeded, CONFIG)


@pytest.mark.parametrize(
    "holder",
    [
        pod("edited", "n", share("c", G0, 10)),  # its assignment names no share... of this slot
        None,  # the API server no longer lists the pod
    ],
)
def test_a_holder_whose_assignment_cannot_explain_its_devices_is_charged_all_they_can_hold(
    holder,
):
    pods = [holder] if holder else []
    ledger = Ledger()
    ledger.rebuild([held("edited", UUIDS[1], resource=RESOURCE_GPU)], pods, DEVICES)
    (charged,) = ledger.charged()
    assert (charged.gpus[0].uuid, charged.gpus[0].memory_mib, charged.shared) == (
        UUIDS[1],
        1000,
        False,
    )
    ledger.keep_only(pods)  # the kubelet, not the API server, says when it is free
    assert len(ledger.charged()) == 1


def test_a_grant_the_kubelet_shows_with_another_pod_leaves_the_assignment_waiting():
    """A pod placed past the scheduler asked for the slot: the matched assignment was not it."""
    waiting = pod("waiting", "n", share("c", G0, 200))
    intruder = replace(pod("intruder", "n"), assignment=None)
    ledger = Ledger()
    grant([slot(0)], DEVICES, "n", [waiting, intruder], ledger, CONFIG)
    assert list(ledger.honoured) == [("uid-waiting", "c")]
    ledger.confirm([held("intruder", slot(0))], [waiting, intruder], DEVICES)
    assert [p.pod.name for p in pending_on("n", [waiting, intruder], ledger)] == ["waiting"]
    (charged,) = ledger.charged()  # the intruder, charged all a share slot can hold
    assert (charged.gpus[0].memory_mib, charged.gpus[0].cores, charged.shared) == (1000, 100, True)


def test_a_candidate_that_leaves_does_not_make_the_other_the_holder():
    """The grant may have been the leaver's: the other is still free to be admitted."""
    first, second = pod("first", "n", share("c", G0, 400)), pod("second", "n", share("c", G0, 600))
    ledger = Ledger()
    grant([slot(0)], DEVICES, "n", [first, second], ledger, CONFIG)  # it was `second`'s
    ledger.keep_only([first])  # `second` ends
    assert ledger.honoured == {}
    assert grant([slot(1)], DEVICES, "n", [first], ledger, CONFIG).pending.pod.name == "first"


def test_holdings_of_devices_not_ours_are_ignored():
    ledger = Ledger()
    ledger.rebuild([held("x", "GPU-elsewhere")], [], DEVICES)
    assert ledger.charged() == []


containers = st.one_of(
    st.builds(
        lambda gpu, mem, cores: share("c", UUIDS[gpu], mem, cores),
        st.integers(0, 1),
        st.integers(1, 700),
        st.integers(1, 100),
    ),
    st.builds(lambda gpu: whole("c", UUIDS[gpu], memory=1000), st.integers(0, 1)),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(containers, min_size=1, max_size=10),
    st.randoms(use_true_random=False),
    st.floats(0, 1),
    st.floats(0, 0.5),
)
def test_no_order_of_admissions_over_commits_a_gpu(assigned, rnd, confirm_rate, end_rate):
    """The kubelet admits pods in any order, pods end, PodResources answers now and then: what
    the pods truly hold, each limited to what Allocate told it, never over-commits a GPU,
    and the ledger ends holding exactly the true holders."""
    pods = [pod(f"p{i}", "n", c, age_s=i) for i, c in enumerate(assigned)]
    ledger, truth, limits = Ledger(), {}, {}
    order = list(range(len(pods)))
    rnd.shuffle(order)
    for i in order:
        ids = _free_devices(assigned[i], truth)
        if ids is None:
            continue
        try:
            granted = grant(ids, DEVICES, "n", pods, ledger, CONFIG)
        except AllocationError:
            continue
        truth[i] = held(
            f"p{i}", *ids, resource=RESOURCE_VGPU if assigned[i].shared else RESOURCE_GPU
        )
        limits[i] = int(granted.envs["INFERGRID_GPU_MEMORY_MIB"])
        assert limits[i] <= min(g.memory_mib for g in assigned[i].gpus)
        _check_fits([assigned[k] for k in truth])
        _check_covers(ledger, [assigned[k] for k in truth])
        if rnd.random() < confirm_rate:
            ledger.confirm(list(truth.values()), pods, DEVICES)
        if rnd.random() < end_rate:  # a running pod ends; its devices may be given out again
            ended = rnd.choice(sorted(truth))
            del truth[ended]
            pods = [p for p in pods if p.name != f"p{ended}"]
            ledger.keep_only(pods)
    ledger.confirm(list(truth.values()), pods, DEVICES)
    assert ledger.honoured == {(f"uid-p{k}", "c"): assigned[k] for k in truth}
    for entry in ledger.provisional.values():  # grants that may have been a leaver's
        assert not entry.sure and not entry.refs & {(f"uid-p{k}", "c") for k in truth}


def _free_devices(container, truth: dict) -> list[str] | None:
    """The devices the kubelet would pick: a free share slot, or the whole GPU."""
    taken = {d for h in truth.values() for d in h.devices}
    uuid = container.gpus[0].uuid
    if not container.shared:
        return None if uuid in taken else [uuid]
    free = [slot(k, uuid) for k in range(CONFIG.vgpu_slots_per_gpu) if slot(k, uuid) not in taken]
    return free[:1] or None


def _tally(containers) -> dict[str, Counter]:
    loads: dict[str, Counter] = {}
    for c in containers:
        for g in c.gpus:
            loads.setdefault(g.uuid, Counter()).update(
                memory=g.memory_mib, cores=g.cores, whole=not c.shared, shares=c.shared
            )
    return loads


def _check_fits(held_containers) -> None:
    """Each held container fits beside the others, as the placement core judges."""
    for k, container in enumerate(held_containers):
        others = Ledger({(f"other-{j}", "c"): c for j, c in enumerate(held_containers) if j != k})
        node = others.holding(INVENTORY.gpus, CONFIG.vgpu_slots_per_gpu)
        assert recheck(node, container) == ()
    for uuid, load in _tally(held_containers).items():
        assert load["memory"] <= 1000 and load["cores"] <= 100, uuid
        assert not (load["whole"] and load["shares"]), uuid
        assert load["whole"] <= 1, uuid


def _check_covers(ledger: Ledger, held_containers) -> None:
    """The ledger charges at least what the pods truly hold, GPU by GPU."""
    true, charged = _tally(held_containers), _tally(ledger.charged())
    for uuid, load in true.items():
        assert charged[uuid]["memory"] >= load["memory"], uuid
        assert charged[uuid]["cores"] >= load["cores"], uuid
