"""The one entry point: a NodeSet answers as ``fit`` and the scorers do, node by node.

The extender keys each node apart; the simulator keys nodes alike together, so
that a pod costs one exact check per distinct state. Either way the answers are
the core's, and only the number of checks changes.
"""

import math
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from infergrid.constants import PLACEMENT_POLICIES
from infergrid.placement import (
    DEFAULT_WORKLOAD,
    HostRequest,
    HostResources,
    NodeSet,
    fit,
    resolve_policy,
)

from .builders import (
    gpu,
    held_whole,
    inventory,
    node_of,
    node_set_of,
    pod,
    scored_rows,
    share,
    whole,
)
from .test_offers import node_list, nodes, requests

L4X2 = inventory(gpu(0), gpu(1))
POLICIES = [resolve_policy(name, DEFAULT_WORKLOAD) for name in PLACEMENT_POLICIES]


@settings(max_examples=150, deadline=None)
@given(st.data(), requests, st.booleans())
def test_filter_and_scores_are_fit_and_the_scorer_node_by_node(data, request, indexed):
    states = node_list(data.draw, data.draw(st.integers(1, 5)))
    node_set = NodeSet(indexed=indexed)
    for state in states:
        node_set.put(state, state.name)
    names = [s.name for s in states]
    for policy in POLICIES:
        results = [fit(request, s, policy) for s in states]
        verdicts = node_set.filter(names, request, policy)
        assert verdicts.passed == [n for n, r in zip(names, results, strict=True) if r.fits]
        for name, result in zip(names, results, strict=True):
            if not result.fits and not indexed:
                assert verdicts.failed[name] == "; ".join(result.reasons)
        raw = node_set.scores(names, request, policy).tolist()
        for state, result, got in zip(states, results, raw, strict=True):
            if result.fits:
                assert got == policy.raw_score(state, result.after, policy.workload)
            else:
                assert math.isnan(got)


@settings(max_examples=60, deadline=None)
@given(st.data(), requests)
def test_scores_kept_for_a_shape_follow_every_node_that_changes(data, request):
    """The extender's way: a pod shape's index scores are kept, and a node rewritten, dropped
    or added since is scored again, as a node set that never scored the shape scores it."""
    states = node_list(data.draw, 4)
    node_set, names = node_set_of(states)
    for policy in POLICIES:
        node_set.scores(names, request, policy)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, 3))
        states[at] = data.draw(nodes(states[at].name))
        node_set.put(states[at], (states[at].name, _))
    node_set.discard(names[0])
    states[0] = data.draw(nodes("node-new"))
    node_set.put(states[0], "new")
    names[0] = "node-new"
    fresh, _ = node_set_of(states)
    for policy in POLICIES:
        kept = node_set.scores(names, request, policy)
        assert np.array_equal(kept, fresh.scores(names, request, policy), equal_nan=True)


@settings(max_examples=60, deadline=None)
@given(st.data(), requests, st.integers(1, 4))
def test_rows_warmed_a_slice_at_a_time_are_the_scores_and_leave_nothing_to_score(
    data, request, size
):
    """The extender's adoption of a new workload: every held row scored ahead, a slice at a
    time, and a node written in between; the next pod of the shape gets the scores a fresh
    node set gives and scores no row but that node's again."""
    states = node_list(data.draw, 5)
    node_set, names = node_set_of(states)
    rows = node_set.held_rows()
    for policy in POLICIES:
        for start in range(0, len(rows), size):
            node_set.warm(rows[start : start + size], request, policy)
    states[0] = data.draw(nodes(states[0].name))
    node_set.put(states[0], "moved")
    fresh, _ = node_set_of(states)
    asked = scored_rows(node_set)
    for policy in POLICIES:
        kept = node_set.scores(names, request, policy)
        assert np.array_equal(kept, fresh.scores(names, request, policy), equal_nan=True)
    assert set(asked) <= {node_set.row_of(states[0].name)}


@settings(max_examples=60, deadline=None)
@given(st.data(), requests)
def test_reasons_kept_for_a_shape_follow_every_node_that_changes(data, request):
    """A pod shape's rejection lines are kept, and a node rewritten, dropped or added since is
    explained again: filter says what a node set that never saw the shape says."""
    states = node_list(data.draw, 4)
    node_set, names = node_set_of(states)
    for policy in POLICIES:
        node_set.filter(names, request, policy)
    for step in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, 3))
        states[at] = data.draw(nodes(states[at].name))
        node_set.put(states[at], (states[at].name, step))
        if data.draw(st.booleans()):
            node_set.discard(names[at])
            node_set.put(states[at], (states[at].name, step, "back"))
    fresh, _ = node_set_of(states)
    for policy in POLICIES:
        kept, anew = node_set.filter(names, request, policy), fresh.filter(names, request, policy)
        assert (kept.passed, kept.failed, kept.unresolvable) == (
            anew.passed,
            anew.failed,
            anew.unresolvable,
        )
        assert sorted(kept.categories) == sorted(anew.categories)


def test_nodes_under_one_key_are_checked_once_and_the_cpu_is_checked_too():
    """The simulator's way: nodes alike share a key; a HostRequest goes to the exact core."""
    cpu = HostResources(cpu_milli=8000, memory_mib=65536)
    alike = [node_of(L4X2) for _ in range(3)]
    node_set = NodeSet(indexed=False)
    for at, state in enumerate(alike):
        node_set.put(replace(state, name=f"n{at}", host=cpu), "idle")
    names = ["n0", "n1", "n2"]
    binpack = POLICIES[0]
    raw = node_set.scores(names, pod(share(4096)), binpack, HostRequest(cpu_milli=4000))
    assert not np.isnan(raw).any() and len(set(raw.tolist())) == 1
    assert node_set.evaluations == 1
    too_much = node_set.scores(names, pod(share(4096)), binpack, HostRequest(cpu_milli=9000))
    assert np.isnan(too_much).all()


def test_a_node_without_a_state_is_unresolvable_with_the_reason_given():
    node_set = NodeSet()
    node_set.put(node_of(L4X2, [held_whole(0, 1)]), "k")
    names = [node_of(L4X2).name, "gone"]
    verdicts = node_set.filter(names, pod(whole(1)), POLICIES[0], missing={1: "no inventory"})
    assert verdicts.unresolvable == {"gone": "no inventory"}
    assert verdicts.failed[names[0]].startswith("container 'engine': 0 of 2 GPUs free, needs 1: ")
