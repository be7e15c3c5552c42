"""`infergrid what-if` on hand-made clusters: the live cluster's GPU pods replayed under each
policy through the simulator's own replay, what each placement leaves free, what a re-pack would
move, and that for the same pods its numbers are `infergrid simulate`'s."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kubernetes import client

from infergrid.assignment_annotation import AssignedGpu, ContainerAssignment, encode_assignment
from infergrid.cli import main
from infergrid.constants import (
    ANNOTATION_GPU_ASSIGNMENT,
    ANNOTATION_GPU_INVENTORY,
    ANNOTATION_GPU_USAGE,
    ANNOTATION_TOPOLOGY,
    LABEL_GPU_PRODUCT,
    PLACEMENT_POLICIES,
    RESOURCE_GPU,
    RESOURCE_GPU_CORES,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
    TOPOLOGY_NVLINK,
    mig_resource,
)
from infergrid.fleet import load_fleet
from infergrid.inventory import Gpu, GpuInventory, encode_inventory
from infergrid.placement import (
    NodeState,
    build_node_state,
    fit,
    node_fragmentation,
    resolve_policy,
    to_pod_assignment,
)
from infergrid.placement.state import ALL_CORES
from infergrid.pod_request import parse_pod_request
from infergrid.records import node_record
from infergrid.simulate.arrivals import arrivals
from infergrid.simulate.cli import simulate
from infergrid.simulate.cluster import GPU_MEMORY_MIB, MIB_PER_MILLI, inventory_of, share_of
from infergrid.simulate.policies import SIM_POLICIES, parse_policies, typical_workload
from infergrid.simulate.trace import MILLI_GPU, TraceNode, TracePod
from infergrid.usage import GpuUsage, GpuUsageSample, encode_usage
from infergrid.what_if import WhatIf, what_if
from infergrid.what_if.live import cluster_of
from infergrid.what_if.measures import stranded_mib
from infergrid.what_if.outcome import SEED, replay_in_order
from infergrid.what_if.repack import Move
from infergrid.what_if.report import COLUMNS

from .simulate.tracefiles import nodes_csv, pods_csv

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
STALE_AFTER = timedelta(seconds=30)
DEMO = {n.name: n for n in load_fleet(Path(__file__).parents[1] / "e2e/fleets/demo.yaml").nodes}


# The cluster as the API server lists it.


def node_json(
    inventory: GpuInventory,
    cpu: str = "32",
    memory: str = "256Gi",
    used: dict[int, int] | None = None,
    heartbeat: datetime = NOW,
) -> dict:
    """A GPU node: the device plugin's inventory and usage (``used`` MiB by GPU index)."""
    samples = tuple(GpuUsageSample(g.uuid, (used or {}).get(g.index, 0), 0) for g in inventory.gpus)
    annotations = {
        ANNOTATION_GPU_INVENTORY: encode_inventory(inventory),
        ANNOTATION_GPU_USAGE: encode_usage(GpuUsage(inventory.node, heartbeat, samples)),
    }
    return {
        "kind": "Node",
        "metadata": {"name": inventory.node, "annotations": annotations},
        "status": {"allocatable": {"cpu": cpu, "memory": memory}},
    }


def t4_node(name: str, used: dict[int, int] | None = None, heartbeat: datetime = NOW) -> dict:
    """Four 16 GiB T4s on PCIe."""
    gpus = tuple(Gpu(f"GPU-{name}-{i}", i, "Tesla T4", 16384, 40, "7.5", 0, True) for i in range(4))
    return node_json(GpuInventory(name, gpus), "16", "64Gi", used, heartbeat)


def demo_node(name: str) -> dict:
    node = DEMO[name]
    return node_json(node.inventory, node.cpu, node.memory)


def pod_json(
    name: str,
    limits: dict[str, str],
    created: str = "2025-03-01T11:00:00Z",
    cpu: str = "1",
    memory: str = "1Gi",
    models: Sequence[str] = (),
) -> dict:
    """A pending pod with one container; ``models`` restrict its node as a required affinity."""
    resources = {"limits": limits, "requests": {"cpu": cpu, "memory": memory}}
    spec: dict = {"containers": [{"name": "main", "resources": resources}]}
    if models:
        term = {"matchExpressions": [{"key": LABEL_GPU_PRODUCT, "operator": "In",
                                      "values": sorted(models)}]}  # fmt: skip
        required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        spec["affinity"] = {"nodeAffinity": required}
    metadata = {
        "name": name,
        "namespace": "fleet",
        "uid": f"uid-{name}",
        "creationTimestamp": created,
    }
    return {"kind": "Pod", "metadata": metadata, "spec": spec, "status": {"phase": "Pending"}}


def whole(gpus: int = 1) -> dict[str, str]:
    return {RESOURCE_GPU: str(gpus)}


def share(memory_mib: int, cores: int | None = None) -> dict[str, str]:
    limits = {RESOURCE_VGPU: "1", RESOURCE_GPU_MEMORY: str(memory_mib)}
    return limits if cores is None else {**limits, RESOURCE_GPU_CORES: str(cores)}


def mig(profile: str) -> dict[str, str]:
    return {mig_resource(profile): "1"}


def state_of(node: dict) -> NodeState:
    record = node_record(node)
    assert record.inventory is not None
    return build_node_state(record.inventory, record.usage, (), NOW, STALE_AFTER)


def bind(nodes: list[dict], pods: list[dict], where: Sequence[str | None], policy: str) -> None:
    """Binds each pod to the node named (None: it stays pending) as the extender's bind does:
    the core places it there, and the pod records the assignment. A pod that does not fit
    there stays pending."""
    states = {n["metadata"]["name"]: state_of(n) for n in nodes}
    core = resolve_policy(policy)
    for pod, node in zip(pods, where, strict=True):
        if node is None:
            continue
        result = fit(parse_pod_request(pod), states[node], core)
        if not result.fits:
            continue
        states[node] = result.after
        held = to_pod_assignment(node, result.placements, NOW)
        annotations = pod["metadata"].setdefault("annotations", {})
        annotations[ANNOTATION_GPU_ASSIGNMENT] = encode_assignment(held)
        pod["spec"]["nodeName"] = node
        pod["status"]["phase"] = "Running"


def run(nodes: list[dict], pods: list[dict], policies: str) -> WhatIf:
    return what_if(nodes, pods, parse_policies(policies), NOW, STALE_AFTER)


def cli(capsys, tmp_path: Path, nodes: list[dict], pods: list[dict], *flags: str):
    """`infergrid what-if --snapshot` on the objects as `kubectl get nodes,pods -A -o json`
    lists them: (exit status, stdout, stderr)."""
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [*nodes, *pods]}))
    status = main(["what-if", "--snapshot", str(path), *flags])
    out, err = capsys.readouterr()
    return status, out, err


# What it reports.


def test_a_pod_that_fits_nowhere_is_reported_under_every_policy(capsys, tmp_path):
    nodes = [t4_node("t4-0")]
    pods = [pod_json("huge", whole(5)), pod_json("small", share(4096, 25))]
    result = run(nodes, pods, "all")
    assert [o.unfit for o in result.outcomes] == [("fleet/huge",)] * len(SIM_POLICIES)
    assert {o.placed for o in result.outcomes} == {1}
    assert result.now.unfit == ("fleet/huge", "fleet/small")  # pending: they hold nothing yet
    status, out, _ = cli(capsys, tmp_path, nodes, pods, "--policies", "binpack,spread")
    assert status == 0
    assert "unfit under binpack: fleet/huge" in out.splitlines()
    assert "unfit under spread: fleet/huge" in out.splitlines()


def fragmented() -> tuple[list[dict], list[dict]]:
    """Three T4 nodes, a 4 GiB share bound on each."""
    nodes = [t4_node(f"t4-{i}") for i in range(3)]
    pods = [pod_json(f"s{i}", share(4096, 25), f"2025-03-01T11:00:0{i}Z") for i in range(3)]
    bind(nodes, pods, ["t4-0", "t4-1", "t4-2"], "spread")
    return nodes, pods


def test_binpack_frees_more_whole_nodes_than_spread_on_a_fragmented_cluster():
    nodes, pods = fragmented()
    result = run(nodes, pods, "spread,binpack")
    spread, binpack = result.outcomes
    assert result.now.measures.free_nodes == ()
    assert spread.measures.free_nodes == ()
    assert binpack.measures.free_nodes == ("t4-1", "t4-2")
    assert (spread.measures.free_gpus, binpack.measures.free_gpus) == (9, 11)
    assert (spread.moved, binpack.moved) == (0, 2)
    assert result.best == "binpack"


def test_stranded_memory_is_free_memory_the_typical_pods_cannot_use():
    # Typical pod: the 12 GiB share. GPU 0 of the node holds a 12 GiB share and has 4 GiB
    # free, which no typical pod fits: 4096 MiB stranded; the three idle GPUs strand none.
    nodes = [t4_node("t4-0")]
    pods = [pod_json("big", share(12288, 75))]
    bind(nodes, pods, ["t4-0"], "binpack")
    result = run(nodes, pods, "binpack")
    assert result.now.measures.stranded_mib == pytest.approx(4096)
    assert result.now.measures.fragmentation_pct == pytest.approx(100 * 0.25 / 3.25)


def test_a_repack_moves_only_what_frees_a_node_and_nothing_in_the_cluster():
    # a: two shares; b: one share; c: a pod holding all four GPUs, which fits nowhere else.
    nodes = [t4_node(name) for name in ("a", "b", "c")]
    pods = [
        pod_json("s1", share(4096, 25), "2025-03-01T11:00:01Z"),
        pod_json("s2", share(4096, 25), "2025-03-01T11:00:02Z"),
        pod_json("s3", share(4096, 25), "2025-03-01T11:00:03Z"),
        pod_json("w", whole(4), "2025-03-01T11:00:04Z"),
    ]
    bind(nodes, pods, ["a", "a", "b", "c"], "binpack")
    listed = copy.deepcopy([*nodes, *pods])
    result = run(nodes, pods, "binpack")
    repack = result.repack
    assert repack.moves == (Move("fleet/s3", "b", "a"),)
    assert repack.freed == ("b",)
    assert (result.now.measures.free_nodes, repack.after.free_nodes) == ((), ("b",))
    assert [*nodes, *pods] == listed  # a plan: nothing the cluster lists was touched


class ReadOnlyApi(client.ApiClient):
    """An API server that lists ``items`` and records every request."""

    def __init__(self, items: list[dict]) -> None:
        super().__init__()
        self.items = items
        self.requests: list[tuple[str, str]] = []

    def call_api(self, method, url, *args, **kwargs):
        self.requests.append((method, url))
        kind = "Node" if "/nodes" in url else "Pod"
        body = {"items": [item for item in self.items if item["kind"] == kind]}
        return SimpleNamespace(status=200, response=SimpleNamespace(data=json.dumps(body)))


def test_the_cluster_is_only_read_and_reads_as_its_snapshot(capsys, tmp_path, monkeypatch):
    nodes = [t4_node(f"t4-{i}", heartbeat=datetime.now(UTC)) for i in range(3)]
    pods = [pod_json(f"s{i}", share(4096, 25), f"2025-03-01T11:00:0{i}Z") for i in range(3)]
    bind(nodes, pods, ["t4-0", "t4-1", "t4-2"], "spread")
    api = ReadOnlyApi([*nodes, *pods])
    monkeypatch.setattr("infergrid.process.kube_api", lambda: api)
    assert main(["what-if", "--json"]) == 0
    live = json.loads(capsys.readouterr().out)
    assert {method for method, _ in api.requests} == {"GET"}
    assert len(api.requests) == 2
    _, out, _ = cli(capsys, tmp_path, nodes, pods, "--json")
    assert live == json.loads(out)
    assert live["repack"]["freed_nodes"] == ["t4-0", "t4-2"]  # both shares went to t4-1


def test_what_stays_put_keeps_what_it_holds():
    """A pod whose request does not read stays with its assignment, and measured use that no
    GPU pod's assignment explains (a process InferGrid did not place) stays too; the GPU
    pods' own use goes with them."""
    nodes = [t4_node("t4-0")]
    pods = [pod_json("s", share(8192, 50))]
    bind(nodes, pods, ["t4-0"], "binpack")  # GPU 0
    nodes = [t4_node("t4-0", used={0: 8192, 3: 12000})]
    odd = pod_json("odd", {RESOURCE_VGPU: "2", RESOURCE_GPU_MEMORY: "1024"})
    held = ContainerAssignment("main", (AssignedGpu("GPU-t4-0-1", 1024, 0),), shared=True)
    odd["metadata"]["annotations"] = {
        ANNOTATION_GPU_ASSIGNMENT: encode_assignment(to_pod_assignment("t4-0", (held,), NOW))
    }
    odd["spec"]["nodeName"] = "t4-0"
    cluster = cluster_of(nodes, [*pods, odd], NOW, STALE_AFTER)
    assert [p.key for p in cluster.pods] == ["fleet/s"]
    assert [p.split(":")[0] for p in cluster.problems] == ["pod fleet/odd"]
    (now,), (vacated,) = cluster.now, cluster.vacated
    assert [g.shares for g in now.gpus] == [1, 1, 0, 0]
    assert [g.shares for g in vacated.gpus] == [0, 1, 0, 0]
    assert [g.used_mib for g in vacated.gpus] == [0, 0, 0, 12000]
    assert now.host is not None and vacated.host is not None
    assert (now.host.requested_cpu_milli, vacated.host.requested_cpu_milli) == (2000, 1000)


def test_a_node_whose_heartbeat_is_stale_offers_nothing():
    nodes = [t4_node("old", heartbeat=NOW - timedelta(hours=1)), t4_node("new")]
    result = run(nodes, [pod_json("w", whole(1))], "spread")
    (spread,) = result.outcomes
    assert spread.placed_on == (("fleet/w", "new"),)
    assert spread.measures.free_nodes == ()  # the stale node is empty, but offers nothing


def test_the_demo_cluster_prints_its_table(capsys, tmp_path):
    """The demo's fleet with its samples placed as `make demo` places them: a whole GPU and
    four 4 GiB, 25% shares on an H100 node, two MIG 3g.40gb instances on the A100."""
    nodes = [demo_node(name) for name in DEMO]
    pods = [pod_json("smollm2-whole-gpu-0", whole(1), "2025-03-01T11:00:00Z")]
    pods += [pod_json(f"embeddings-{i}", mig("3g.40gb"), f"2025-03-01T11:00:1{i}Z") for i in (0, 1)]
    pods += [pod_json(f"smollm2-{i}", share(4096, 25), f"2025-03-01T11:00:2{i}Z") for i in range(4)]
    bind(nodes, pods, ["h100-0", "a100-mig", "a100-mig", *["h100-0"] * 4], "fgd-cluster-aware")
    status, out, err = cli(capsys, tmp_path, nodes, pods)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert tuple(lines[0].split()) == COLUMNS
    rows = {line.split()[0]: line.split() for line in lines[1:7]}
    assert list(rows) == ["now", *PLACEMENT_POLICIES, "re-pack"]
    for name in ("now", *PLACEMENT_POLICIES):
        assert rows[name][1:3] == ["7", "0"]  # every sample placed, none unfit
    assert rows["now"][4:6] == ["4", "18"]  # h100-1, the T4s, the L4; 2+4+3+8+1 GPUs
    assert "a plan only, nothing was moved" in out


# Bad input names the field.


@pytest.mark.parametrize(
    ("flags", "items", "error"),
    [
        (("--policies", "tightest"), [], "error: policies: 'tightest' is not one of"),
        (("--stale-after", "0"), [], "error: stale-after: must be above 0 seconds"),
        ((), [{"kind": "Pod", "metadata": {"name": "p"}}], "items[0].metadata.uid: is required"),
        ((), [{"kind": "Node", "metadata": {}}], "items[0].metadata.name: is required"),
        (
            (),
            [{"kind": "Pod", "metadata": {"name": "p", "uid": "u"}, "spec": []}],
            "items[0].spec: expected object, got list",
        ),
    ],
)
def test_bad_input_is_named(capsys, tmp_path, flags, items, error):
    status, out, err = cli(capsys, tmp_path, items, [], *flags)
    assert (status, out) == (2, "")
    assert error in err


def test_a_snapshot_that_is_no_list_is_named(capsys, tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text('{"kind": "List"}')
    assert main(["what-if", "--snapshot", str(path)]) == 2
    assert capsys.readouterr().err == f"error: {path}.items: is required\n"


# Properties: the replay never over-commits a GPU, and every pod is placed or named unfit.


NODE_KINDS = ("h100-0", "a100-mig", "t4-0")
POD_KINDS = st.one_of(
    st.builds(whole, st.sampled_from((1, 1, 2, 4))),
    st.builds(share, st.sampled_from((1024, 4096, 8192, 12000)), st.sampled_from((None, 10, 50))),
    st.just(mig("3g.40gb")),
)
clusters = st.tuples(
    st.lists(st.sampled_from(NODE_KINDS), min_size=1, max_size=4),
    st.lists(st.tuples(POD_KINDS, st.booleans(), st.integers(0, 3)), max_size=14),
    st.sampled_from(PLACEMENT_POLICIES),
)


def assert_not_overcommitted(node: NodeState) -> None:
    for g in node.gpus:
        assert g.assigned_mib <= g.memory_mib and g.assigned_cores <= ALL_CORES, g
        assert g.shares <= g.share_slots and g.holders <= g.time_slices, g
        assert not (g.shares and g.held_whole), g
        assert not (g.mig_enabled and (g.shares or g.holders)), g
    if node.host is not None:
        assert node.host.requested_cpu_milli <= node.host.cpu_milli
        assert node.host.requested_memory_mib <= node.host.memory_mib


def build(kinds: list[str], asks: list) -> tuple[list[dict], list[dict]]:
    """Nodes of the demo's kinds, and pods of which some are bound (by fgd-cluster-aware)."""
    nodes = []
    for i, kind in enumerate(kinds):
        fleet = DEMO[kind]
        gpus = tuple(
            replace(g, uuid=f"{g.uuid}-{i}", mig_instances=tuple(
                replace(m, uuid=f"{m.uuid}-{i}") for m in g.mig_instances
            ))
            for g in fleet.inventory.gpus
        )  # fmt: skip
        inventory = replace(fleet.inventory, node=f"{kind}-{i}", gpus=gpus)
        nodes.append(node_json(inventory, fleet.cpu, fleet.memory))
    pods, where = [], []
    for i, (limits, nvlink, on) in enumerate(asks):
        pod = pod_json(f"p{i:02d}", limits, f"2025-03-01T11:00:{i:02d}Z")
        if nvlink:
            pod["metadata"]["annotations"] = {ANNOTATION_TOPOLOGY: TOPOLOGY_NVLINK}
        pods.append(pod)
        where.append(nodes[on]["metadata"]["name"] if on < len(nodes) else None)
    bind(nodes, pods, where, "fgd-cluster-aware")
    return nodes, pods


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters)
def test_no_replay_over_commits_and_every_pod_is_placed_or_named_unfit(cluster):
    kinds, asks, policy = cluster
    nodes, pods = build(kinds, asks)
    live = cluster_of(nodes, pods, NOW, STALE_AFTER)
    keys = [p.key for p in live.pods]
    played = replay_in_order(
        live.vacated, [p.pod for p in live.pods], live.typical, SIM_POLICIES[policy]
    )
    for node in played.nodes:
        assert_not_overcommitted(node)
    result = what_if(nodes, pods, parse_policies("all"), NOW, STALE_AFTER)
    for outcome in result.outcomes:
        assert [pod for pod, _ in outcome.placed_on] == keys
        assert outcome.placed + len(outcome.unfit) == len(keys)
    now_on = dict(result.now.placed_on)
    moved = [m.pod for m in result.repack.moves]
    assert len(moved) == len(set(moved))
    assert {m.source for m in result.repack.moves} == set(result.repack.freed)
    for move in result.repack.moves:
        assert now_on[move.pod] == move.source != move.target
        assert move.target not in result.repack.freed
    assert set(result.repack.freed) <= set(result.repack.after.free_nodes)


def trace_node(at: int, model: str, gpus: int, cpu: int) -> TraceNode:
    return TraceNode(f"t{at}", cpu, 262144, gpus, model)


def trace_pod(at: int, ask: tuple[int, int], cpu: int, spec: frozenset[str]) -> TracePod:
    return TracePod(f"p{at:02d}", cpu, 1024, *ask, spec)


held_shares = st.lists(st.sampled_from((0, 100, 250, 500, 700, 1000)), min_size=4, max_size=4)
typical_shapes = st.lists(
    st.tuples(
        st.sampled_from(((1, 250), (1, 500), (1, 300), (1, 1000), (2, 1000))),
        st.sampled_from((0, 32000, 128000)),  # the node has 64 cores
        st.sampled_from((frozenset(), frozenset({"T4"}), frozenset({"V100"}))),
    ),
    min_size=1,
    max_size=4,
).map(lambda specs: [trace_pod(i, *spec) for i, spec in enumerate(specs)])


@settings(max_examples=60, deadline=None)
@given(held_shares, typical_shapes)
def test_stranded_memory_is_the_simulators_fragmentation_in_mib(held, typical_pods):
    """Where free memory and free SMs are the same fraction of each GPU (the trace's), stranded
    MiB is F_n, in GPUs, times the GPU's memory: the typical pods that cannot run on the node
    at all (another model, too little CPU) strand all of its free memory."""
    pods = [pod_json(f"h{i}", share(*share_of(m))) for i, m in enumerate(held) if m]
    nodes = [node_json(inventory_of(TraceNode("n", 64000, 262144, 4, "T4")), "64", "256Gi")]
    bind(nodes, pods, ["n"] * len(pods), "spread")
    (state,) = cluster_of(nodes, pods, NOW, STALE_AFTER).now
    workload = typical_workload(typical_pods)
    assert stranded_mib(state, workload) == pytest.approx(
        node_fragmentation(state, workload) * GPU_MEMORY_MIB
    )


# Agreement: for the same pods, what-if's numbers are `infergrid simulate`'s.


def equivalent_cluster(
    nodes: Sequence[TraceNode], pods: Sequence[TracePod], inflation: float
) -> tuple[list[dict], list[dict]]:
    """The trace as a live cluster whose what-if replays what `infergrid simulate --seeds SEED`
    does: the seed's node order as node names, its arrivals as creation order, each pod's
    request as the simulator maps it, nothing bound yet."""
    capacity = sum(n.gpus for n in nodes) * MILLI_GPU
    order = arrivals(len(nodes), pods, capacity, SEED, inflation)
    assert sorted(order.pods) == list(range(len(pods)))  # no pod drawn again, none dropped
    live_nodes = []
    for position, at in enumerate(order.node_order):
        node = replace(nodes[at], name=f"n{position:02d}")
        cpu, memory = f"{node.cpu_milli}m", f"{node.memory_mib}Mi"
        live_nodes.append(node_json(inventory_of(node), cpu, memory))
    return live_nodes, [live_pod(pods[at], arrival) for arrival, at in enumerate(order.pods)]


def live_pod(pod: TracePod, arrival: int) -> dict:
    """The trace pod as a pending pod, the ``arrival``-th created, asking what the simulator
    maps it to."""
    limits = whole(pod.num_gpu) if pod.gpu_milli >= MILLI_GPU else share(*share_of(pod.gpu_milli))
    created = (NOW + timedelta(seconds=arrival)).strftime("%Y-%m-%dT%H:%M:%SZ")
    cpu, memory = f"{pod.cpu_milli}m", f"{pod.memory_mib}Mi"
    return pod_json(f"p{arrival:03d}", limits, created, cpu, memory, pod.gpu_spec)


TYPICAL_KINDS = (
    TracePod("w", 4000, 1024, 1, 1000),
    TracePod("w2", 8000, 1024, 2, 1000, frozenset({"T4"})),
    TracePod("s", 2000, 1024, 1, 500),
    TracePod("s-cpu", 6000, 1024, 1, 500),
    TracePod("t", 1000, 1024, 1, 250, frozenset({"T4", "V100"})),
    TracePod("x", 1000, 1024, 1, 750),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=6, max_size=6), st.randoms())
def test_the_typical_pods_are_the_simulators(counts, rng):
    """Fragmentation and stranded memory are measured over the typical pods; a cluster's are
    those `infergrid simulate` takes of a trace of the same pods: the commonest shapes ten
    at a time until they cover 95% of the pods, a rare shape kept or left out alike."""
    kinds = [kind for kind, count in zip(TYPICAL_KINDS, counts, strict=True) for _ in range(count)]
    assume(kinds)
    pods = [replace(kind, name=f"p{i}") for i, kind in enumerate(kinds)]
    rng.shuffle(pods)
    nodes = [node_json(inventory_of(TraceNode("n", 64000, 262144, 4, "T4")), "64", "256Gi")]
    live = cluster_of(nodes, [live_pod(p, i) for i, p in enumerate(pods)], NOW, STALE_AFTER)
    assert live.typical == typical_workload(pods)


def last_bin(nodes: Sequence[TraceNode], pods: Sequence[TracePod]) -> int:
    """The arrived % bin of the last arrival, which holds it alone where the trace is made so."""
    total = sum(p.gpu_request_milli for p in pods)
    return round(100 * total / (sum(n.gpus for n in nodes) * MILLI_GPU))


def simulated_at(run: dict) -> dict:
    """The simulator's JSON run at its one checkpoint, the last arrival."""
    (at,) = run["checkpoints"]
    assert at["failed_pods"] == run["failed_pods"]
    return at


def assert_agree(mine: dict, theirs: dict, capacity_milli: int) -> None:
    """What-if's numbers for a policy (its JSON's names) against the simulator's at the last
    arrival: failed pods, unallocated GPU % and fragmentation rate %, and stranded memory,
    which is Σ F_n at 16 MiB per milli-GPU of a trace GPU."""
    assert len(mine["unfit"]) == theirs["failed_pods"]
    assert mine["unallocated_gpu_pct"] == pytest.approx(theirs["unallocated_gpu_pct"], abs=2e-4)
    frag = theirs["fragmentation_rate_pct"]
    assert mine["fragmentation_rate_pct"] == pytest.approx(frag, abs=2e-4)
    fragment_milli = frag * theirs["unallocated_gpu_pct"] * capacity_milli / 1e4
    assert mine["stranded_mib"] == pytest.approx(fragment_milli * MIB_PER_MILLI, rel=1e-3, abs=1)


TRACE_NODES = [
    TraceNode("big", 32000, 131072, 4, "T4"),
    TraceNode("v", 16000, 131072, 2, "V100"),
    TraceNode("small", 8000, 65536, 2, "T4"),
]
TRACE_PODS = [
    *(TracePod(f"s{i}", 2000, 4096, 1, 500) for i in range(4)),
    TracePod("w4", 8000, 8192, 4, 1000),
    TracePod("w2", 4000, 8192, 2, 1000),
    TracePod("q", 1000, 4096, 1, 250, frozenset({"V100"})),
    TracePod("r", 1000, 4096, 1, 750),
    TracePod("x", 6000, 4096, 1, 500),
]
"""9.5 GPUs' worth of pods on 8 GPUs: arrivals stop at exactly 118.75%, the last alone in its
bin; the policies differ in what fails (one pod or two) and in what they fragment."""


def test_what_if_agrees_with_the_simulator_on_the_same_pods(capsys, tmp_path):
    inflation = 1.1875
    nodes_path = nodes_csv(tmp_path, *(f"{n.name},{n.cpu_milli},{n.memory_mib},{n.gpus},{n.model}"
                                       for n in TRACE_NODES))  # fmt: skip
    pods_path = pods_csv(tmp_path, *(
        f"{p.name},{p.cpu_milli},{p.memory_mib},{p.num_gpu},{p.gpu_milli},{'|'.join(p.gpu_spec)}"
        for p in TRACE_PODS
    ))  # fmt: skip
    at = last_bin(TRACE_NODES, TRACE_PODS)
    assert main(["simulate", "--nodes", str(nodes_path), "--pods", str(pods_path),
                 "--policies", "all", "--seeds", str(SEED), "--inflation", str(inflation),
                 "--at", str(at), "--json", "--quiet"]) == 0  # fmt: skip
    simulated = json.loads(capsys.readouterr().out)["policies"]
    nodes, pods = equivalent_cluster(TRACE_NODES, TRACE_PODS, inflation)
    status, out, _ = cli(capsys, tmp_path, nodes, pods, "--policies", "all", "--json")
    assert status == 0
    whatif = json.loads(out)["policies"]
    assert [p["name"] for p in whatif] == [p["name"] for p in simulated] == list(SIM_POLICIES)
    for mine, theirs in zip(whatif, simulated, strict=True):
        assert_agree(mine, simulated_at(theirs["runs"][0]), 8 * MILLI_GPU)
    assert {len(p["unfit"]) for p in whatif} == {1, 2}


trace_nodes = st.lists(
    st.tuples(
        st.sampled_from(("T4", "V100")),
        st.sampled_from((1, 2, 4, 8)),
        st.sampled_from((8000, 16000, 64000)),
    ),
    min_size=1,
    max_size=4,
).map(lambda specs: [trace_node(i, *spec) for i, spec in enumerate(specs)])
trace_pods = st.lists(
    st.tuples(
        st.one_of(
            st.tuples(st.just(1), st.sampled_from((100, 250, 500, 750, 900))),
            st.tuples(st.sampled_from((1, 1, 2, 4)), st.just(MILLI_GPU)),
        ),
        st.sampled_from((0, 1000, 4000, 16000)),
        st.sampled_from((frozenset(), frozenset(), frozenset({"T4"}), frozenset({"T4", "V100"}))),
    ),
    min_size=1,
    max_size=14,
).map(lambda specs: [trace_pod(i, *spec) for i, spec in enumerate(specs)])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace_nodes, trace_pods)
def test_what_if_agrees_with_the_simulator_on_random_traces(nodes, pods):
    capacity = sum(n.gpus for n in nodes) * MILLI_GPU
    total = sum(p.gpu_request_milli for p in pods)
    inflation = total / capacity
    assume(inflation * capacity == total and total <= 1.3 * capacity)  # arrivals stop exactly
    order = arrivals(len(nodes), pods, capacity, SEED, inflation)
    last = pods[order.pods[-1]].gpu_request_milli
    assume(round(100 * (total - last) / capacity) != last_bin(nodes, pods))
    policies = parse_policies("fgd-cluster-aware,fgd,binpack,spread,fgd-paper,random-fit")
    at = last_bin(nodes, pods)
    results = simulate(nodes, pods, policies, (SEED,), inflation)
    live_nodes, live_pods = equivalent_cluster(nodes, pods, inflation)
    mine = what_if(live_nodes, live_pods, policies, None, STALE_AFTER)
    for outcome, result in zip(mine.outcomes, results, strict=True):
        (run,) = result.runs
        assert run.curves.failed_pods[at] == run.failed_pods
        theirs = {
            "failed_pods": run.failed_pods,
            "unallocated_gpu_pct": run.curves.unallocated_pct[at],
            "fragmentation_rate_pct": run.curves.frag_rate_pct[at],
        }
        measures = outcome.measures
        ours = {
            "unfit": outcome.unfit,
            "unallocated_gpu_pct": measures.unallocated_pct,
            "fragmentation_rate_pct": measures.fragmentation_pct,
            "stranded_mib": measures.stranded_mib,
        }
        assert_agree(ours, theirs, capacity)
