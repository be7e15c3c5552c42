"""The extender's whole-cluster answers (view, then ``NodeSet``) against ``fit`` node by node.

A random stream of pods of every kind is filtered, prioritized and bound on a
small mixed fleet while heartbeats age past ``stale_after`` and come back,
nodes break and return, and names the cache never heard of are asked about.
The offer-index path must pass the same nodes, reject the same ones (with a
reason ``fit`` also gives, or a count of why no GPU takes shares) and give the
same raw scores, bit for bit, as ``fit`` and the scorer run per node on a second
view's states.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest.mock import patch

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infergrid.constants import (
    ANNOTATION_GPU_INVENTORY,
    ANNOTATION_GPU_USAGE,
    ANNOTATION_PLACEMENT_POLICY,
    ANNOTATION_TOPOLOGY,
    PLACEMENT_POLICIES,
    RESOURCE_GPU,
    RESOURCE_GPU_CORES,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
    mig_resource,
)
from infergrid.fleet import load_fleet
from infergrid.inventory import encode_inventory
from infergrid.placement import (
    Verdicts,
    fit,
    idle_usage,
    normalize_scores,
    offers,
    resolve_policy,
    to_pod_assignment,
)
from infergrid.placement.offers import MAX_GPUS
from infergrid.pod_request import parse_pod_request
from infergrid.usage import encode_usage
from scheduler_extender import decisions, watch_cache
from scheduler_extender.decisions import filter_nodes, prioritize_nodes
from scheduler_extender.view import PlacementView
from scheduler_extender.watch_cache import ADDED, CHANGE_LOG, MODIFIED, ClusterCache

NOW = datetime(2026, 1, 1, tzinfo=UTC)
STALE_AFTER = timedelta(seconds=30)
SAMPLE = load_fleet(Path(__file__).resolve().parents[2] / "e2e" / "fleets" / "sample.yaml")
FLEET = SAMPLE.nodes
NAMES = [n.name for n in FLEET]


def publish(cache: ClusterCache, node, at: datetime, event: str = MODIFIED) -> None:
    usage = idle_usage(node.inventory, at)
    annotations = {
        ANNOTATION_GPU_INVENTORY: encode_inventory(node.inventory),
        ANNOTATION_GPU_USAGE: encode_usage(usage),
    }
    cache.apply_node(event, {"metadata": {"name": node.name, "annotations": annotations}})


def break_node(cache: ClusterCache, node) -> None:
    annotations = {ANNOTATION_GPU_INVENTORY: "{not json"}
    cache.apply_node(MODIFIED, {"metadata": {"name": node.name, "annotations": annotations}})


@st.composite
def pods(draw: st.DrawFn, uid: int) -> dict:
    kind = draw(st.sampled_from(("share", "share", "whole", "whole", "mig", "two")))
    if kind == "share":
        limits = {RESOURCE_VGPU: "1", RESOURCE_GPU_MEMORY: str(draw(st.sampled_from(
            (1024, 4096, 8192, 16384, 23034, 40000))))}  # fmt: skip
        if draw(st.booleans()):
            limits[RESOURCE_GPU_CORES] = str(draw(st.sampled_from((10, 30, 50, 100))))
    elif kind == "whole":
        limits = {RESOURCE_GPU: str(draw(st.sampled_from((1, 1, 2, 3, 4, 8))))}
    elif kind == "mig":
        limits = {mig_resource(draw(st.sampled_from(("3g.40gb", "1g.10gb")))): "1"}
    else:
        limits = {RESOURCE_VGPU: "1", RESOURCE_GPU_MEMORY: "4096"}
    containers = [{"name": "engine", "resources": {"limits": limits}}]
    if kind == "two":
        containers.append({"name": "side", "resources": {"limits": {RESOURCE_GPU: "1"}}})
    annotations = {ANNOTATION_PLACEMENT_POLICY: draw(st.sampled_from(PLACEMENT_POLICIES))}
    if draw(st.booleans()):
        annotations[ANNOTATION_TOPOLOGY] = "nvlink"
    return {
        "metadata": {"name": f"p{uid}", "namespace": "t", "uid": f"u{uid}",
                     "annotations": annotations},
        "spec": {"containers": containers},
    }  # fmt: skip


steps = st.one_of(
    st.tuples(st.just("pod"), st.integers(0, 10**6)),
    st.tuples(st.just("pod"), st.integers(0, 10**6)),
    st.tuples(st.just("pod"), st.integers(0, 10**6)),
    st.tuples(st.just("age"), st.sampled_from((5, 20, 31))),
    st.tuples(st.just("beat"), st.sampled_from(NAMES)),
    st.tuples(st.just("break"), st.sampled_from(NAMES)),
)


def fast_filter(view: PlacementView, names: list[str], request, policy, now) -> Verdicts:
    rows, missing = view.current(names, now)
    found = view.nodes.filter(names, request, policy, rows, missing)
    view.remember(found, len(names))
    return found


def fast_scores(view: PlacementView, names: list[str], request, policy, now) -> np.ndarray:
    rows, _ = view.current(names, now)
    return view.nodes.scores(names, request, policy, rows=rows)


def slow_filter(view: PlacementView, names: list[str], request, policy, now) -> Verdicts:
    """``fit`` on each node's state, one by one."""
    out = Verdicts([], np.zeros(0, dtype=np.int64), {}, {}, [])
    for name in names:
        state = view.node_state(name, now)
        if isinstance(state, str):
            out.unresolvable[name] = state
            continue
        result = fit(request, state, policy)
        if result.fits:
            out.passed.append(name)
        else:
            out.failed[name] = "; ".join(result.reasons)
    return out


def slow_scores(view: PlacementView, names: list[str], request, policy, now) -> np.ndarray:
    raw = np.full(len(names), np.nan)
    for at, name in enumerate(names):
        state = view.node_state(name, now)
        if not isinstance(state, str) and (after := fit(request, state, policy).after):
            raw[at] = policy.raw_score(state, after, policy.workload)
    return raw


def reasons_agree(fast: str, slow: str) -> bool:
    """Each line of the index's reason is one of fit's, or counts why no GPU takes shares."""
    if ": none of " in fast and " GPUs takes a share: " in fast:
        return True
    return set(fast.split("; ")) <= set(slow.split("; "))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.data(),
    st.lists(steps, min_size=5, max_size=25),
    st.sampled_from((MAX_GPUS, 4)),
    st.sampled_from((CHANGE_LOG, 1)),
)
def test_the_offer_index_answers_as_fit_does_node_by_node(data, plan, widest, log):
    """With ``widest`` 4 the 8-GPU nodes are not indexed and go through ``fit`` in the mix;
    with a ``log`` of one change the view often finds the cache's log too short and rereads."""
    with patch.object(offers, "MAX_GPUS", widest), patch.object(watch_cache, "CHANGE_LOG", log):
        run_plan(data, plan)


def run_plan(data, plan) -> None:
    cache = ClusterCache()
    for node in FLEET:
        publish(cache, node, NOW, ADDED)
    fast = PlacementView(cache, STALE_AFTER)
    slow = PlacementView(cache, STALE_AFTER)
    now = NOW
    asked = [*NAMES, "nowhere"]
    for step, arg in plan:
        if step == "age":
            now += timedelta(seconds=arg)
            continue
        node = next((n for n in FLEET if n.name == arg), None)
        if step == "beat":
            publish(cache, node, now)
            continue
        if step == "break":
            break_node(cache, node)
            continue
        pod = data.draw(pods(arg))
        request = parse_pod_request(pod)
        policy = resolve_policy(request.policy, fast.workload())
        got = fast_filter(fast, asked, request, policy, now)
        want = slow_filter(slow, asked, request, policy, now)
        assert got.passed == want.passed
        assert got.unresolvable == want.unresolvable
        assert got.failed.keys() == want.failed.keys()
        for name, reason in got.failed.items():
            assert reasons_agree(reason, want.failed[name]), (name, reason, want.failed[name])
        for names in (asked, got.passed):  # prioritize is asked about those that passed
            fast_raw = fast_scores(fast, names, request, policy, now)
            assert fast_raw.tobytes() == slow_scores(slow, names, request, policy, now).tobytes()
        if got.passed:
            chosen = got.passed[arg % len(got.passed)]
            result = fit(request, fast.node_state(chosen, now), policy)
            meta = pod["metadata"]
            cache.reserve(
                meta["uid"], "t", meta["name"], to_pod_assignment(chosen, result.placements, now)
            )


def test_filter_and_prioritize_agree_through_decisions():
    cache = ClusterCache()
    for node in FLEET:
        publish(cache, node, NOW, ADDED)
    view = PlacementView(cache, STALE_AFTER)
    pod = {
        "metadata": {"name": "p", "namespace": "t", "uid": "u", "annotations": {}},
        "spec": {"containers": [{"name": "engine", "resources": {"limits": {RESOURCE_GPU: "2"}}}]},
    }
    out = filter_nodes(pod, NAMES, view, "binpack", NOW)
    assert out.passed == ["a100-0", "a100-1", "l4-0", "l4-1", "h100", "local-a100"]
    scores = prioritize_nodes(pod, NAMES, view, "binpack", NOW)
    assert scores["h100"] == 10 and max(scores.values()) == 10
    later = NOW + STALE_AFTER + timedelta(seconds=1)
    out = filter_nodes(pod, NAMES, view, "binpack", later)
    assert out.passed == []
    assert all("node heartbeat is stale" in r for r in out.failed.values())


EDGE_SCORES = (0.0, -0.0, 0.25, 1.5, 3.0, -2.0, 1e308, -1e308, math.nan, math.inf, -math.inf)


@given(st.lists(st.sampled_from(EDGE_SCORES) | st.floats(), max_size=30))
def test_normalising_each_distinct_score_equals_normalising_the_nodes_that_fit(raw):
    """NaN is a node that does not fit: it gets 0 and takes no part in the scale."""
    feasible = iter(normalize_scores([r for r in raw if not math.isnan(r)]))
    want = [0 if math.isnan(r) else next(feasible) for r in raw]
    assert decisions._normalized(np.array(raw, dtype=np.float64)) == want
