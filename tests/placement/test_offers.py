"""The offer index against the core: every answer it gives is what ``fit`` and the scorer say.

Nodes are drawn GPU by GPU with any mix of health, measured use, assignments,
shares, slots, MIG, NVLink layouts and staleness, consistent or not, with or
without CPU and memory tracked, of two GPU models, since the index must agree
with ``fit`` on whatever state it is handed. Scores must be equal, not close:
normalising maps them onto 0..10 with a floor, fgd-cluster-aware quantises, and
the simulator (the exact core) and the extender (the index) must choose alike,
so a last-bit difference could move a node across a step.
"""

from dataclasses import replace
from datetime import timedelta
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infergrid.constants import (
    LINK_NVLINK,
    LINK_SYSTEM,
    RESOURCE_GPU,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
)
from infergrid.placement import (
    Demand,
    GpuState,
    HostRequest,
    HostResources,
    MigSlot,
    NodeState,
    OfferIndex,
    Rejections,
    Workload,
    fit,
    resolve_policy,
    with_cluster,
)
from infergrid.placement.fit import surely_unfit
from infergrid.placement.offers import MAX_GPUS
from infergrid.pod_request import PodGpuRequest

from .builders import (
    BINPACK,
    FGD,
    NOW,
    SPREAD,
    held_whole,
    inventory,
    mig,
    node_of,
    pod,
    share,
    whole,
)
from .builders import gpu as inventory_gpu

FGD_MIXED = resolve_policy(
    "fgd", Workload.of([(Demand(whole_gpus=1), 3), (Demand(memory_mib=8192, cores=30), 2)])
)
MODELS = ("M", "T4")
TYPICAL = Workload.of(
    [
        (Demand(whole_gpus=1, cpu_milli=8000), 3),
        (Demand(memory_mib=8192, cores=30, cpu_milli=4000), 2),
        (Demand(whole_gpus=2, gpu_models=frozenset({"T4"})), 1),
        (Demand(memory_mib=4096, cores=0, cpu_milli=2000, gpu_models=frozenset({"M"})), 1),
        (Demand(cpu_milli=16000), 1),  # CPU-only
    ]
)
CLUSTER_AWARE = tuple(
    resolve_policy("fgd-cluster-aware", with_cluster(TYPICAL, {"M": 24, "T4": 8}, cpu))
    for cpu in (0, 32 * 4000, 32 * 64000)  # not known, short of CPU, plenty
)
POLICIES = (BINPACK, SPREAD, FGD, FGD_MIXED, *CLUSTER_AWARE)
HOSTS = st.one_of(
    st.none(),
    st.builds(
        HostRequest,
        st.sampled_from((0, 1000, 8000)),
        st.sampled_from((0, 4096)),
        st.sampled_from((frozenset(), frozenset({"M"}), frozenset({"T4", "A100"}))),
    ),
)


@st.composite
def gpu_states(draw: st.DrawFn, index: int, count: int) -> GpuState:
    """Half idle and healthy, so whole GPUs and NVLink sets are found; half anything at all."""
    numa = draw(st.sampled_from((0, index * 2 // max(count, 1))))
    memory = draw(st.sampled_from((0, 300, 16384, 24576, 81920, 81920)))
    if draw(st.booleans()):
        used = draw(st.sampled_from((0, 0, 100, 511)))
        return GpuState(
            f"GPU-{index}", index, "M", max(memory, 16384), 108, numa, True, True, {}, used
        )
    in_mig = draw(st.integers(0, 7)) == 0
    slots = tuple(
        MigSlot(f"MIG-{index}-{k}", "1g.10gb", 9728, 14, taken=draw(st.booleans()))
        for k in range(draw(st.integers(0, 3)) if in_mig else 0)
    )
    return GpuState(
        uuid=f"GPU-{index}",
        index=index,
        model="M",
        memory_mib=memory,
        sm_count=108,
        numa_node=numa,
        healthy=draw(st.integers(0, 11)) > 0,
        measured=draw(st.integers(0, 11)) > 0,
        links={},
        used_mib=draw(st.sampled_from((0, 0, 0, 100, 511, 512, 2048, 20480, 90000))),
        assigned_mib=draw(st.sampled_from((0, 0, 0, 4096, 8192, 24576, 70000, 81920))),
        assigned_cores=draw(st.sampled_from((0, 0, 10, 30, 50, 70, 100, 130))),
        shares=draw(st.sampled_from((0, 0, 0, 1, 2, 4, 10))),
        share_slots=draw(st.sampled_from((1, 4, 10, 10))),
        holders=int(draw(st.integers(0, 5)) == 0),
        mig_enabled=in_mig,
        mig=slots,
    )


@st.composite
def nodes(draw: st.DrawFn, name: str = "node-a") -> NodeState:
    count = draw(st.sampled_from((0, 1, 2, 3, 4, 8, 8, 8, 12)))
    gpus = [draw(gpu_states(i, count)) for i in range(count)]
    pairs = [(a, b) for a in range(count) for b in range(a + 1, count)]
    if not pairs:
        linked = {}
    elif draw(st.booleans()):  # an NVSwitch, or one missing some links
        linked = {p: 12 for p in pairs if draw(st.integers(0, 9)) > 0}
    else:  # a few pairs, as on PCIe boards with bridges
        linked = {p: draw(st.integers(1, 4)) for p in draw(st.lists(st.sampled_from(pairs)))}

    def links(i: int) -> MappingProxyType:
        pair = {j: (min(i, j), max(i, j)) for j in range(count) if j != i}
        return MappingProxyType(
            {
                j: (LINK_NVLINK, linked[p]) if p in linked else (LINK_SYSTEM, 0)
                for j, p in pair.items()
            }
        )

    model = draw(st.sampled_from(MODELS))
    gpus = [replace(g, links=links(i), model=model) for i, g in enumerate(gpus)]
    heartbeat = draw(st.sampled_from((None, *(NOW,) * 6, NOW - timedelta(hours=1))))
    offers = heartbeat is not None and draw(st.integers(0, 7)) > 0
    host = None
    if draw(st.booleans()):
        host = HostResources(
            64000, 262144, draw(st.sampled_from((0, 8000, 56000, 60000, 64000, 70000))), 258048
        )
    return NodeState(name, tuple(gpus), offers, heartbeat, host=host)


requests = st.one_of(
    st.builds(
        lambda mib, cores, name: pod(share(mib, cores, name=name)),
        st.sampled_from((0, 1024, 4096, 8192, 16384, 24576, 81920, 90000)),
        st.sampled_from((0, 10, 30, 50, 100)),
        st.sampled_from(("engine", "c0")),
    ),
    st.builds(
        lambda count, topology: pod(whole(count), topology=topology),
        st.sampled_from((1, 1, 2, 2, 3, 4, 8, 9, 13)),
        st.sampled_from((None, "nvlink")),
    ),
)


def indexed(states: list[NodeState]) -> tuple[OfferIndex, list[int]]:
    index = OfferIndex()
    for state in states:
        assert index.update(state)
    return index, index.rows([s.name for s in states]).tolist()


def node_list(draw: st.DrawFn, size: int) -> list[NodeState]:
    return [draw(nodes(f"node-{i}")) for i in range(size)]


@settings(max_examples=400, deadline=None)
@given(st.data(), requests, HOSTS)
def test_feasibility_scores_and_reasons_equal_the_core(data, request, host):
    states = node_list(data.draw, data.draw(st.integers(1, 6)))
    index, rows = indexed(states)
    for policy in POLICIES:
        results = [fit(request, s, policy) for s in states]
        fits = index.fits(index.rows([s.name for s in states]), request)
        assert fits is not None
        assert fits.tolist() == [r.fits for r in results]
        raw = index.raw_scores(index.rows([s.name for s in states]), request, policy, host)
        assert raw is not None
        for state, got in zip(states, raw.tolist(), strict=True):
            result = fit(request, state, policy, host)
            if result.fits:
                assert got == policy.raw_score(state, result.after, policy.workload)
            else:
                assert got != got  # NaN
        rejected = [r for r, res in zip(rows, results, strict=True) if not res.fits]
        why = index.why_not(index.rows([states[r].name for r in rejected]), request, policy)
        for row, reason in zip(rejected, why.reasons, strict=True):
            check_reason(states[row], request, reason, fit(request, states[row], policy))
        assert len(why.resources) >= len(rejected)


def check_reason(state: NodeState, request: PodGpuRequest, reason: str, result) -> None:
    """Stale nodes and whole GPUs get every reason fit gives; a share one GPU's, or a count."""
    (container,) = request.gpu_containers
    if not state.offers or container.kind == "whole":
        assert reason == "; ".join(result.reasons)
        return
    if reason.startswith(f"container {container.name!r}: none of "):
        assert not any(
            g.available and not g.mig_enabled and not g.held_whole for g in state.gpus
        ), reason
        return
    assert set(reason.split("; ")) <= set(result.reasons), (reason, result.reasons)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_rewritten_and_dropped_rows_answer_for_their_latest_state(data):
    states = node_list(data.draw, 4)
    index, _ = indexed(states)
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, 3))
        states[at] = data.draw(nodes(states[at].name))
        assert index.update(states[at])
    index.discard(states[0].name)
    names = [s.name for s in states]
    rows = index.rows(names)
    assert rows[0] == -1 and all(r >= 0 for r in rows[1:])
    request = data.draw(requests)
    fits = index.fits(rows[1:], request)
    assert fits is not None
    assert fits.tolist() == [fit(request, s, BINPACK).fits for s in states[1:]]
    assert index.update(states[0]) and index.rows(names[:1])[0] >= 0


def test_what_the_index_does_not_answer_is_none():
    node = node_of(inventory(*(inventory_gpu(i, mig=("1g.10gb",) * (i == 1)) for i in range(2))))
    index, rows = indexed([node])
    at = index.rows([node.name])
    assert index.fits(at, pod(mig("1g.10gb"))) is None
    assert index.fits(at, pod(share(1024, name="a"), share(1024, name="b"))) is None
    assert index.fits(at, PodGpuRequest(containers=())) is None
    assert index.raw_scores(at, pod(mig("1g.10gb")), FGD) is None
    assert index.raw_scores(at, pod(share(1024)), resolve_policy("fgd-paper")) is None
    assert index.fits(at, pod(share(1024))) is not None
    assert not index.answers(pod(mig("1g.10gb"))) and index.answers(pod(whole(2)))
    assert index.scores(pod(share(1024)), SPREAD) and index.scores(pod(share(1024)), FGD)
    assert not index.scores(pod(share(1024)), resolve_policy("random-fit"))
    assert index.scores(pod(whole(1)), BINPACK) and not index.scores(pod(mig("1g.10gb")), BINPACK)


def test_no_rows_give_empty_answers():
    index = OfferIndex()
    none = index.rows([])
    for request in (pod(share(1024)), pod(whole(2), topology="nvlink")):
        assert index.fits(none, request).tolist() == []
        assert index.raw_scores(none, request, BINPACK).tolist() == []
        assert index.why_not(none, request, BINPACK) == Rejections([], [])


def test_nodes_too_wide_or_out_of_index_order_are_not_indexed():
    index = OfferIndex()
    wide = NodeState("wide", tuple(_plain(i) for i in range(MAX_GPUS + 1)), True, NOW)
    assert not index.update(wide)
    assert not index.update(NodeState("shuffled", (_plain(1), _plain(0)), True, NOW))
    assert index.rows(["wide", "shuffled"]).tolist() == [-1, -1]


MEASURED = (
    "container 'engine': GPU-0 (index 0): 0 MiB free, needs 8192"
    " (24576 MiB measured in use, 0 assigned)"
)


NO_WHOLE = (
    "container 'engine': 0 of 2 GPUs free, needs 2: "
    "1 held whole by another pod, 1 in use outside assignments"
)


@pytest.mark.parametrize(
    ("request_", "reason", "resource"),
    [
        (pod(share(8192)), MEASURED, [RESOURCE_GPU_MEMORY]),
        (pod(whole(2)), NO_WHOLE, [RESOURCE_GPU]),
        (pod(whole(2), topology="nvlink"), NO_WHOLE, [RESOURCE_GPU]),
    ],
)
def test_reasons_name_the_numbers_people_act_on(request_, reason, resource):
    """A whole-GPU pod hears why the GPUs are not free, counted by cause, not only how many
    are: one line for every node in the same state, as kube-scheduler's summary counts them."""
    inv = inventory(inventory_gpu(0), inventory_gpu(1))
    node = node_of(inv, [held_whole(1)], used={0: 24576})
    index, _ = indexed([node])
    at = index.rows([node.name])
    assert index.fits(at, request_).tolist() == [False]
    why = index.why_not(at, request_, BINPACK)
    assert why.reasons == [reason]
    assert why.resources == resource


def test_a_missing_nvlink_is_named_with_the_largest_set():
    node = node_of(inventory(*(inventory_gpu(i) for i in range(3)), nvlink={(0, 1): 4}))
    index, _ = indexed([node])
    at = index.rows([node.name])
    request = pod(whole(3), topology="nvlink")
    assert index.fits(at, request).tolist() == [False]
    assert index.why_not(at, request, BINPACK).reasons == [
        "container 'engine': no NVLink-connected set of 3 free GPUs (largest has 2 of 3 free)"
    ]
    assert index.fits(at, pod(whole(2), topology="nvlink")).tolist() == [True]


def test_a_node_with_every_gpu_held_says_how_many_and_why():
    node = node_of(inventory(inventory_gpu(0), inventory_gpu(1)), [held_whole(0, 1)])
    index, _ = indexed([node])
    why = index.why_not(index.rows([node.name]), pod(share(1024)), BINPACK)
    assert why.reasons == [
        "container 'engine': none of 2 GPUs takes a share: 2 held whole by another pod"
    ]
    assert why.resources == [RESOURCE_VGPU]


def _plain(index: int) -> GpuState:
    return GpuState(f"GPU-{index}", index, "M", 1024, 10, 0, True, True, MappingProxyType({}))


@settings(max_examples=300, deadline=None)
@given(nodes(), requests, st.sampled_from(POLICIES))
def test_what_surely_unfit_refuses_the_core_refuses_too(state, request, policy):
    """A scorer skips the fit where ``surely_unfit`` says so: it must never skip a fit."""
    if surely_unfit(request, state, None):
        assert not fit(request, state, policy).fits
