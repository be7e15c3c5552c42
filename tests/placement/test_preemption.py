"""Preemption on GPU shares: the smallest set of lower-priority holders of a preemptible class
whose eviction lets the pod fit, never a holder of equal or higher priority or of a class
outside the set, and no node when nothing would help."""

from dataclasses import replace
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from infergrid.placement import fit
from infergrid.placement.preemption import (
    EXACT_CANDIDATES,
    NO_CLASS,
    Holder,
    cheapest_node,
    choose_victims,
    without,
)

from .builders import (
    BINPACK,
    L4_MIB,
    gpu,
    held_share,
    held_whole,
    inventory,
    node_of,
    pod,
    share,
    whole,
)

L4X2 = inventory(gpu(0), gpu(1))
ONLINE, OFFLINE = 1000, 0
ANY = frozenset({NO_CLASS})
"""The holders here name no class unless a test says: with this set, all of them may go."""


def holders_and_node(specs, used=None):
    """specs: (uid, priority, gpu index, MiB, cores) shares; the node with them all held."""
    assignments = [held_share(index, mib, cores, name=uid) for uid, _, index, mib, cores in specs]
    holders = [
        Holder(uid, priority, a.containers)
        for (uid, priority, *_), a in zip(specs, assignments, strict=True)
    ]
    return holders, node_of(L4X2, assignments, used=used)


def test_a_pod_that_fits_evicts_nobody():
    holders, node = holders_and_node([("a", OFFLINE, 0, 4096, 20)])
    assert choose_victims(pod(share(8192, 50)), node, holders, ONLINE, BINPACK, ANY) == ()


def test_a_whole_gpu_takes_the_gpu_with_fewest_offline_shares():
    holders, node = holders_and_node(
        [("a", OFFLINE, 0, 4096, 20), ("b", OFFLINE, 0, 4096, 20), ("c", OFFLINE, 1, 8192, 30)]
    )
    assert choose_victims(pod(whole(1)), node, holders, ONLINE, BINPACK, ANY) == ("c",)


def test_holders_of_equal_or_higher_priority_are_never_evicted():
    holders, node = holders_and_node([("a", ONLINE, 0, 20000, 50), ("b", ONLINE, 1, 20000, 50)])
    assert choose_victims(pod(share(8192, 50)), node, holders, ONLINE, BINPACK, ANY) is None
    assert choose_victims(pod(share(8192, 50)), node, holders, ONLINE + 1, BINPACK, ANY) == ("a",)


def test_the_node_is_dropped_when_even_evicting_everyone_would_not_do():
    holders, node = holders_and_node([("a", OFFLINE, 0, 4096, 20)])
    assert choose_victims(pod(whole(3)), node, holders, ONLINE, BINPACK, ANY) is None


def test_a_victims_measured_memory_goes_with_it():
    """GPU-0 is measured full by its offline share's process: once evicted, the GPU is free."""
    holders, node = holders_and_node([("a", OFFLINE, 0, 20000, 20), ("b", ONLINE, 1, 20000, 20)],
                                     used={0: 20000, 1: 20000})  # fmt: skip
    assert choose_victims(pod(share(16384, 50)), node, holders, ONLINE, BINPACK, ANY) == ("a",)
    assert without(node, holders[:1]).gpus[0].used_mib == 0


def test_among_equal_sizes_the_least_important_victim_goes():
    holders, node = holders_and_node([("low", 0, 0, 20000, 20), ("mid", 5, 1, 20000, 20)])
    assert choose_victims(pod(share(16384, 50)), node, holders, ONLINE, BINPACK, ANY) == ("low",)


def test_a_whole_gpu_holder_is_a_candidate_too():
    assignment = held_whole(0, name="w")
    holders = [Holder("w", OFFLINE, assignment.containers)]
    node = node_of(L4X2, [assignment])
    assert choose_victims(pod(whole(2)), node, holders, ONLINE, BINPACK, ANY) == ("w",)


def test_a_holder_of_a_class_outside_the_preemptible_set_is_never_evicted():
    """GPU 1's share is the lighter victim, but its class did not agree to preemption."""
    holders, node = holders_and_node(
        [("batch", OFFLINE, 0, 20000, 20), ("tenant", 0, 1, 10000, 20)]
    )
    holders = [replace(holders[0], priority_class="offline"), holders[1]]
    offline = frozenset({"offline"})
    assert choose_victims(pod(whole(1)), node, holders, ONLINE, BINPACK, offline) == ("batch",)
    assert choose_victims(pod(whole(2)), node, holders, ONLINE, BINPACK, offline) is None
    assert choose_victims(pod(whole(1)), node, holders, ONLINE, BINPACK, frozenset()) is None


def test_the_cheapest_node_looks_only_at_preemptible_holders():
    mine, node_a = holders_and_node([("a1", OFFLINE, 0, 20000, 20), ("a2", OFFLINE, 1, 20000, 20)])
    mine = [replace(h, priority_class="offline") for h in mine]
    theirs, node_b = holders_and_node([("b1", OFFLINE, 0, 20000, 20)])
    node_b = replace(node_b, name="node-b")
    offline = frozenset({"offline"})
    name, victims = cheapest_node(pod(whole(2)), [(node_a, mine), (node_b, theirs)], ONLINE,
                                  BINPACK, offline)  # fmt: skip
    assert (name, sorted(v.uid for v in victims)) == (node_a.name, ["a1", "a2"])


shares = st.lists(
    st.tuples(
        st.integers(0, 1),
        st.integers(1, 6).map(lambda k: k * 2048),
        st.sampled_from([10, 20, 40]),
        st.integers(0, 3),
    ),  # fmt: skip
    min_size=0,
    max_size=8,
)


@settings(max_examples=80, deadline=None)
@given(held=shares, ask_mib=st.integers(1, 12).map(lambda k: k * 2048),
       ask_cores=st.sampled_from([10, 50, 100]), whole_gpus=st.integers(0, 2),
       priority=st.integers(0, 4))  # fmt: skip
def test_victims_are_lower_priority_make_room_and_no_smaller_set_would(
    held, ask_mib, ask_cores, whole_gpus, priority
):
    specs, per_gpu = [], {0: 0, 1: 0}
    for i, (index, mib, cores, prio) in enumerate(held):
        if per_gpu[index] + mib <= L4_MIB:  # what a real node could hold
            per_gpu[index] += mib
            specs.append((f"p{i}", prio, index, mib, cores))
    holders, node = holders_and_node(specs)
    request = pod(whole(whole_gpus)) if whole_gpus else pod(share(ask_mib, ask_cores))
    victims = choose_victims(request, node, holders, priority, BINPACK, ANY)
    lower = [h for h in holders if h.priority < priority]
    room = lambda chosen: fit(request, without(node, chosen), BINPACK).fits  # noqa: E731
    if victims is None:
        assert not room(lower)
        return
    chosen = [h for h in holders if h.uid in victims]
    assert len(chosen) == len(victims) and all(h.priority < priority for h in chosen)
    assert room(chosen)
    assert len(lower) > EXACT_CANDIDATES or not any(
        room(smaller) for size in range(len(chosen)) for smaller in combinations(lower, size)
    )


def test_the_cheapest_node_is_the_one_with_fewest_then_least_important_victims():
    two, node_a = holders_and_node(
        [("a1", OFFLINE, 0, 10000, 20), ("a2", OFFLINE, 0, 10000, 20), ("a3", 5, 1, 20000, 20)]
    )
    one, node_b = holders_and_node([("b1", 5, 0, 20000, 20), ("b2", ONLINE, 1, 20000, 20)])
    node_b = replace(node_b, name="node-b")
    one_low, node_c = holders_and_node(
        [("c1", OFFLINE, 0, 20000, 20), ("c2", ONLINE, 1, 20000, 20)]
    )
    node_c = replace(node_c, name="node-c")
    request = pod(whole(1))
    name, victims = cheapest_node(request, [(node_a, two), (node_b, one), (node_c, one_low)],
                                  ONLINE, BINPACK, ANY)  # fmt: skip
    assert (name, [v.uid for v in victims]) == ("node-c", ["c1"])
    assert cheapest_node(pod(whole(2)), [(node_b, one)], ONLINE, BINPACK, ANY) is None


CLASSES = ("offline", "batch", "system-node-critical", NO_CLASS)


@settings(max_examples=120, deadline=None)
@given(held=shares, classes=st.lists(st.sampled_from(CLASSES), min_size=8, max_size=8),
       preemptible=st.frozensets(st.sampled_from(CLASSES)),
       ask_mib=st.integers(1, 12).map(lambda k: k * 2048), whole_gpus=st.integers(0, 2),
       priority=st.integers(0, 4))  # fmt: skip
def test_victims_come_from_the_preemptible_set_only_and_it_chooses_as_if_alone(
    held, classes, preemptible, ask_mib, whole_gpus, priority
):
    """Whatever the classes: no victim outside the set, and the answer is the one the
    preemptible holders alone would get with every class allowed, so a set that makes room
    still finds the plan it found before there were sets."""
    specs, per_gpu = [], {0: 0, 1: 0}
    for i, (index, mib, cores, prio) in enumerate(held):
        if per_gpu[index] + mib <= L4_MIB:
            per_gpu[index] += mib
            specs.append((f"p{i}", prio, index, mib, cores))
    holders, node = holders_and_node(specs)
    holders = [replace(h, priority_class=c) for h, c in zip(holders, classes, strict=False)]
    request = pod(whole(whole_gpus)) if whole_gpus else pod(share(ask_mib, 50))
    victims = choose_victims(request, node, holders, priority, BINPACK, preemptible)
    by_uid = {h.uid: h for h in holders}
    assert all(by_uid[uid].priority_class in preemptible for uid in victims or ())
    alone = [replace(h, priority_class=NO_CLASS) for h in holders
             if h.priority_class in preemptible]  # fmt: skip
    assert victims == choose_victims(request, node, alone, priority, BINPACK, ANY)
