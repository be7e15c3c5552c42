"""Random placements and releases on random nodes: invariants hold, annotations rebuild the state.

The checks recount everything from the live assignments themselves, so they do
not trust the bookkeeping they check.
"""

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from infergrid.assignment_annotation import PodAssignment, decode_assignment, encode_assignment
from infergrid.inventory import GpuInventory
from infergrid.placement import (
    ALL_CORES,
    Demand,
    FragmentationTally,
    NodeState,
    Workload,
    build_node_state,
    fit,
    node_fragmentation,
    release,
    reservation_from_assignment,
    resolve_policy,
    to_pod_assignment,
)
from infergrid.placement.reserve import reserved_share
from infergrid.pod_request import PodGpuRequest
from infergrid.usage import GpuUsage

from .builders import NODE, NOW, STALE_AFTER, gpu, inventory, mig, share, usage, whole

PROFILES = ("1g.10gb", "3g.40gb")
SHARE_MIB = (1024, 4096, 8192, 16384, 24576)
SHARE_CORES = (10, 25, 30, 50, 100)
FGD_MIXED = resolve_policy(
    "fgd",
    Workload.of([(Demand(whole_gpus=1), 3), (Demand(memory_mib=8192, cores=30), 2)]),
)
POLICIES = (resolve_policy("binpack"), resolve_policy("spread"), resolve_policy("fgd"), FGD_MIXED)


@st.composite
def inventories(draw: st.DrawFn) -> GpuInventory:
    count = draw(st.sampled_from((1, 2, 4, 8, 8)))
    gpus = []
    for i in range(count):
        in_mig = draw(st.integers(0, 4)) == 0
        profiles = (
            draw(st.lists(st.sampled_from(PROFILES), min_size=1, max_size=3)) if in_mig else []
        )
        gpus.append(
            gpu(
                i,
                memory=draw(st.sampled_from((16384, 24576, 81920))),
                healthy=draw(st.integers(0, 9)) > 0,
                numa=i * 2 // count,
                mig=tuple(profiles),
            )
        )
    pairs = [(a, b) for a in range(count) for b in range(a + 1, count)]
    linked = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=16)) if pairs else []
    nvlink = {pair: draw(st.integers(1, 12)) for pair in linked}
    return inventory(*gpus, nvlink=nvlink)


@st.composite
def usages(draw: st.DrawFn, inv: GpuInventory) -> GpuUsage:
    used = {g.index: draw(st.sampled_from((0, 0, 0, 300, 2000, 20000))) for g in inv.gpus}
    missing = [g.index for g in inv.gpus if draw(st.integers(0, 19)) == 0]
    return usage(inv, used, missing=missing)


containers = st.one_of(
    st.builds(share, st.sampled_from(SHARE_MIB), st.sampled_from(SHARE_CORES)),
    st.builds(whole, st.sampled_from((1, 1, 2, 4))),
    st.builds(mig, st.sampled_from((*PROFILES, *PROFILES, "7g.80gb"))),
)


@st.composite
def pods(draw: st.DrawFn) -> PodGpuRequest:
    asked = [draw(containers) for _ in range(draw(st.sampled_from((1, 1, 1, 2, 3))))]
    first_is_init = draw(st.booleans())
    named = tuple(
        replace(c, name=f"c{i}", init=first_is_init and i == 0) for i, c in enumerate(asked)
    )
    return PodGpuRequest(named, topology=draw(st.sampled_from((None, "nvlink"))))


place = st.tuples(st.just("place"), pods(), st.sampled_from(POLICIES))
operations = st.lists(
    st.one_of(place, place, st.tuples(st.just("release"), st.integers(0, 50), st.none())),
    min_size=8,
    max_size=30,
)


def check_promises(before: NodeState, pod: PodGpuRequest, placed: PodAssignment) -> None:
    """What fit promised: available GPUs, idle for whole ones, room for shares, NVLink.

    Room is checked container by container, as the design defines free memory:
    total less the larger of what is assigned so far and what is measured.
    """
    gpus = {g.uuid: g for g in before.gpus}
    assigned = Counter({g.uuid: g.assigned_mib for g in before.gpus})
    cores = Counter({g.uuid: g.assigned_cores for g in before.gpus})
    for container in placed.containers:
        taken = [gpus[a.uuid] for a in container.gpus]
        assert all(g.available and not g.mig_enabled for g in taken)
        if container.mig is not None:
            assert gpus[container.mig.gpu_uuid].available
        elif container.shared:
            (a,) = container.gpus
            g = gpus[a.uuid]
            assert a.memory_mib <= g.memory_mib - max(assigned[a.uuid], g.used_mib)
            assert cores[a.uuid] + a.cores <= ALL_CORES
            assigned[a.uuid] += a.memory_mib
            cores[a.uuid] += a.cores
        else:
            assert all(g.takes_whole() and not assigned[g.uuid] for g in taken)
            assigned.update({g.uuid: g.memory_mib for g in taken})
            if pod.topology == "nvlink":
                assert all(a.nvlinks(b.index) for a in taken for b in taken if a is not b)


def check_invariants(state: NodeState, live: dict[int, PodAssignment]) -> None:
    """Recounted from the live assignments: nothing over-committed, nothing held twice."""
    memory, cores, shares, wholes, migs = Counter(), Counter(), Counter(), Counter(), Counter()
    for assignment in live.values():
        for container in assignment.containers:
            if container.mig is not None:
                migs[container.mig.uuid] += 1
            for a in container.gpus:
                memory[a.uuid] += a.memory_mib
                cores[a.uuid] += a.cores
                (shares if container.shared else wholes)[a.uuid] += 1
    assert all(n == 1 for n in migs.values())
    for g in state.gpus:
        assert g.assigned_mib == memory[g.uuid] <= g.memory_mib
        assert g.assigned_cores == cores[g.uuid] <= ALL_CORES
        assert (g.shares, g.holders) == (shares[g.uuid], wholes[g.uuid])
        assert not (g.held_whole and g.shares)
        assert g.shares <= g.share_slots
        assert {s.uuid for s in g.mig if s.taken} == {s.uuid for s in g.mig if migs[s.uuid]}


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_random_placements_and_releases_keep_every_invariant(data):
    inv = data.draw(inventories())
    use = data.draw(usages(inv))
    base = build_node_state(inv, use, (), NOW, STALE_AFTER)
    state, live, serial = base, {}, 0
    for action, arg, policy in data.draw(operations):
        if action == "place":
            result = fit(arg, state, policy)
            if not result.fits:
                assert result.reasons and result.after is None
                continue
            placed = to_pod_assignment(NODE, result.placements, NOW)
            check_promises(state, arg, placed)
            state, live[serial], serial = result.after, placed, serial + 1
        elif live:
            key = sorted(live)[arg % len(live)]
            held, issues = reservation_from_assignment(live.pop(key), state)
            assert issues == ()
            state = release(state, held)
        check_invariants(state, live)
        annotations = [decode_assignment(encode_assignment(a)) for a in live.values()]
        rebuilt = build_node_state(inv, use, annotations, NOW, STALE_AFTER)
        assert rebuilt == state
        assert rebuilt.issues == ()
    for assignment in live.values():
        state = release(state, reservation_from_assignment(assignment, state)[0])
    assert state == base


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_the_tally_agrees_with_recomputing_fragmentation(data):
    inv = data.draw(inventories())
    state = build_node_state(inv, data.draw(usages(inv)), (), NOW, STALE_AFTER)
    at = data.draw(st.integers(0, len(state.gpus) - 1))
    old = state.gpus[at]
    new = reserved_share(
        old, data.draw(st.sampled_from(SHARE_MIB)), data.draw(st.sampled_from(SHARE_CORES))
    )
    changed = NodeState(state.name, (*state.gpus[:at], new, *state.gpus[at + 1 :]), state.offers)
    workload = data.draw(st.sampled_from(POLICIES)).workload
    tally = FragmentationTally(state, workload)
    assert abs(tally.total_if(old, new) - node_fragmentation(changed, workload)) < 1e-9
