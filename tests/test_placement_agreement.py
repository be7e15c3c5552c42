"""The simulator and the extender choose alike: the same pods on the same nodes, through both.

``bench/packing.py`` measures production only if the simulator decides as the
extender does. Here random small clusters take random streams of pods under
every policy a pod may ask for. The simulator replays them (its workload
learned from the pods, as the extender learns it); the extender, fed the same
nodes as annotations (and allocatable CPU, some of it scarce), is asked, as
kube-scheduler asks it, about the nodes with the pod's CPU free; it filters and
prioritizes each pod through ``decisions``
and binds the simulator's choice as its binder does. For every pod both must
agree on which nodes fit, and the node the simulator picks must be the
extender's first best: top of prioritize, and first in node order among the
best raw scores, which is the one the InferGrid profile's kube-scheduler
takes when the extender's score decides.
"""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infergrid.assignment_annotation import encode_assignment
from infergrid.constants import (
    ANNOTATION_GPU_ASSIGNMENT,
    ANNOTATION_GPU_INVENTORY,
    ANNOTATION_GPU_USAGE,
    ANNOTATION_PLACEMENT_POLICY,
    PLACEMENT_POLICIES,
    RESOURCE_GPU,
    RESOURCE_GPU_CORES,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
)
from infergrid.inventory import encode_inventory
from infergrid.placement import LEARNING, fit, idle_usage, resolve_policy, to_pod_assignment
from infergrid.pod_host import parse_host_request
from infergrid.pod_request import parse_pod_request
from infergrid.simulate.arrivals import Arrivals
from infergrid.simulate.cluster import _EPOCH as NOW
from infergrid.simulate.cluster import inventory_of, share_of
from infergrid.simulate.policies import SIM_POLICIES
from infergrid.simulate.replay import SCORE_DIGITS, Scenario, play
from infergrid.simulate.trace import MILLI_GPU, TraceNode, TracePod
from infergrid.usage import encode_usage
from scheduler_extender.decisions import filter_nodes, prioritize_nodes
from scheduler_extender.view import PlacementView
from scheduler_extender.watch_cache import ADDED, ClusterCache

STALE_AFTER = timedelta(seconds=30)
PLENTY = 10**6
"""Memory MiB of each node, and CPU millicores of some: kube-scheduler's checks never bind."""

trace_nodes = st.lists(
    st.tuples(
        st.sampled_from(("T4", "V100")),
        st.sampled_from((1, 2, 4, 8)),
        st.sampled_from((8000, 16000, 32000, PLENTY)),
    ),
    min_size=1,
    max_size=5,
).map(lambda specs: [TraceNode(f"n{i}", cpu, PLENTY, g, m) for i, (m, g, cpu) in enumerate(specs)])

trace_pods = st.lists(
    st.tuples(
        st.one_of(
            st.tuples(st.just(1), st.sampled_from((100, 250, 500, 700, 900))),
            st.tuples(st.sampled_from((1, 1, 2, 4)), st.just(MILLI_GPU)),
        ),
        st.sampled_from((0, 500, 2000, 8000)),
    ),
    min_size=1,
    max_size=30,
).map(
    lambda specs: [
        TracePod(f"p{i}", cpu, 0, n, m, frozenset()) for i, ((n, m), cpu) in enumerate(specs)
    ]
)


def node_json(node: TraceNode) -> dict:
    inventory = inventory_of(node)
    annotations = {
        ANNOTATION_GPU_INVENTORY: encode_inventory(inventory),
        ANNOTATION_GPU_USAGE: encode_usage(idle_usage(inventory, NOW)),
    }
    allocatable = {"cpu": f"{node.cpu_milli}m", "memory": f"{node.memory_mib}Mi"}
    return {
        "metadata": {"name": node.name, "annotations": annotations},
        "status": {"allocatable": allocatable},
    }


def pod_json(pod: TracePod, uid: str, policy: str) -> dict:
    if pod.gpu_milli >= MILLI_GPU:
        limits = {RESOURCE_GPU: str(pod.num_gpu)}
    else:
        memory, cores = share_of(pod.gpu_milli)
        limits = {
            RESOURCE_VGPU: "1",
            RESOURCE_GPU_MEMORY: str(memory),
            RESOURCE_GPU_CORES: str(cores),
        }
    resources = {"limits": limits, "requests": {"cpu": f"{pod.cpu_milli}m"}}
    return {
        "metadata": {"name": uid, "namespace": "t", "uid": uid, "resourceVersion": "1",
                     "annotations": {ANNOTATION_PLACEMENT_POLICY: policy}},
        "spec": {"containers": [{"name": "main", "resources": resources}]},
    }  # fmt: skip


def cpu_free(cache: ClusterCache, node: TraceNode) -> int:
    """The node's CPU that no bound pod requests, as kube-scheduler's NodeResourcesFit sees
    it (from the same watch the extender keeps)."""
    return node.cpu_milli - cache.requested_on(node.name)[0]


def first_best(names: list[str], raw: np.ndarray) -> str | None:
    """The first node, in the order given, of the best raw score as the simulator rounds it."""
    rounded = [round(r, SCORE_DIGITS) for r in raw.tolist()]
    feasible = [r for r in rounded if not math.isnan(r)]
    return names[rounded.index(max(feasible))] if feasible else None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace_nodes, trace_pods, st.sampled_from(PLACEMENT_POLICIES))
def test_the_simulator_chooses_what_the_extender_would(nodes, pods, policy):
    scenario = Scenario.of(nodes, pods)
    order = Arrivals(0, tuple(range(len(nodes))), tuple(range(len(pods))))
    placed_on = play(scenario, SIM_POLICIES[policy], order).placed_on

    cache = ClusterCache()
    for node in nodes:
        cache.apply_node(ADDED, node_json(node))
    view = PlacementView(cache, STALE_AFTER)
    for arrival, (pod, chosen) in enumerate(zip(pods, placed_on, strict=True)):
        body = pod_json(pod, f"u{arrival}", policy)
        # kube-scheduler asks the extender only about nodes with the pod's CPU free.
        names = [n.name for n in nodes if cpu_free(cache, n) >= pod.cpu_milli]
        passed = filter_nodes(body, names, view, "binpack", NOW).passed if names else []
        if chosen is None:
            assert passed == [], (arrival, passed)
            continue
        assert chosen in passed, (arrival, chosen, passed)
        scores = prioritize_nodes(body, passed, view, "binpack", NOW)
        assert scores[chosen] == max(scores.values()), (arrival, chosen, scores)
        request = parse_pod_request(body)
        rows, _ = view.current(passed, NOW)
        workload_policy = resolve_policy(request.policy, view.workload())
        host = parse_host_request(body) if policy in LEARNING else None
        raw = view.nodes.scores(passed, request, workload_policy, host, rows)
        assert first_best(passed, raw) == chosen, (
            arrival,
            dict(zip(passed, raw.tolist(), strict=True)),
        )
        # Bind as the binder does: fit on the chosen node's state, recorded as the annotation,
        # and the watch then shows the pod bound (its CPU counted on the node).
        result = fit(request, view.node_state(chosen, NOW), workload_policy)
        assignment = to_pod_assignment(chosen, result.placements, NOW)
        body["metadata"]["annotations"][ANNOTATION_GPU_ASSIGNMENT] = encode_assignment(assignment)
        body["spec"]["nodeName"] = chosen
        body["status"] = {"phase": "Running"}
        cache.apply_pod(ADDED, body)
