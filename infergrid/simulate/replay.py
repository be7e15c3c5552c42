"""Replaying one seed's arrivals, pod by pod, through the extender's entry point.

For each pod the replay does what kube-scheduler and the extender do together:
it asks the placement core's ``NodeSet`` (the one the extender's filter and
prioritize ask) for every node's raw score (GPUs, and the pod's CPU, memory and
GPU models, which kube-scheduler checks in a cluster), then picks
(``SimPolicy``); the chosen node becomes ``NodeSet.place(...).after``, as bind
does. Nothing here decides placement.

The production policies score against the workload the extender would have:
``LearnedWorkload`` fed the pods as they arrive, with the cluster's GPUs per
model and CPU. ``Scenario.learned=False`` feeds them the trace's typical pods
instead (what the paper's simulator does), to show what learning costs. The
paper's policies always read the trace's.

It is fast because nodes that look alike to placement are asked once. A node's
signature is everything fit and the scorers read of it: its shape (model, GPU
count, CPU, memory), its CPU and memory requested, and the multiset of its
GPUs' holdings (GPU order does not matter: the simulated GPUs are alike, and
neither the fits nor any scorer reads names or indices, only ties among equal
GPUs do, and equal GPUs give equal results). The signature is the node's key
in the node set, which memoises per key and pod shape, and nodes are kept in
groups by signature: a pod asks about one node per group, and the core runs
only for states it has not seen with that shape and workload. ``cache=False``
keys every node apart, for tests that check both agree.

A live cluster's nodes (``Scenario.of_states``, for ``infergrid what-if``) are not
alike: their GPUs differ in memory, links, MIG layout, health and measured use.
Each is then a shape of its own, and its signature lists its GPUs' holdings (MIG
instances taken included) in index order.
"""

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

import numpy as np

from infergrid.placement import (
    LEARNING,
    HostRequest,
    LearnedWorkload,
    NodeSet,
    NodeState,
    Policy,
    Workload,
    resolve_policy,
    with_cluster,
)
from infergrid.pod_request import PodGpuRequest
from infergrid.simulate.arrivals import DEFAULT_INFLATION, Arrivals, arrivals
from infergrid.simulate.cluster import SimPod, node_state, sim_pod
from infergrid.simulate.metrics import (
    Curves,
    Measurement,
    curves,
    fragmentation_rate,
    node_fragment,
)
from infergrid.simulate.policies import SimPolicy, typical_workload
from infergrid.simulate.trace import MILLI_GPU, TraceNode, TracePod

SCORE_DIGITS: Final = 9
"""Raw scores equal to this many decimals tie, as in the core's GPU choice."""

Signature = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class Scenario:
    """Pods ready to replay on nodes: node states built once, pods grouped by shape.

    ``states`` are the nodes as the replay finds them (a trace's empty), ``requests``
    holds each pod shape's request as the core sees it, and ``workload`` the typical
    pods (the metric's M, and the paper's policies' workload), with how contested
    each GPU model of these nodes is and their CPU per GPU (fgd-cluster-aware reads
    both); ``gpus_per_model`` and ``cpu_milli`` are that cluster. ``learned`` says
    whether the production policies learn their workload from the pods as the
    extender does (else they read ``workload``). ``alike``: nodes of one shape hold
    alike GPUs, as a trace's do (see the module).
    """

    states: tuple[NodeState, ...]
    pods: tuple[SimPod, ...]
    node_shapes: tuple[int, ...]
    pod_shapes: tuple[int, ...]
    requests: tuple[tuple[PodGpuRequest, HostRequest], ...]
    workload: Workload
    capacity_milli: int
    gpus_per_model: tuple[tuple[str, int], ...] = ()
    cpu_milli: int = 0
    learned: bool = True
    alike: bool = True

    @staticmethod
    def of(
        nodes: Sequence[TraceNode], pods: Sequence[TracePod], learned: bool = True
    ) -> "Scenario":
        """A trace's nodes, empty, and its pods; M is the trace's typical pods."""
        node_kinds: dict[tuple[object, ...], int] = {}
        node_shapes = tuple(
            node_kinds.setdefault((n.model, n.gpus, n.cpu_milli, n.memory_mib), len(node_kinds))
            for n in nodes
        )
        states = [node_state(n) for n in nodes]
        return Scenario.of_states(
            states, [sim_pod(p) for p in pods], typical_workload(pods), learned, node_shapes
        )

    @staticmethod
    def of_states(
        states: Sequence[NodeState],
        pods: Sequence[SimPod],
        typical: Workload,
        learned: bool = True,
        node_shapes: Sequence[int] | None = None,
    ) -> "Scenario":
        """Nodes as they are and pods already in the core's types, M the ``typical`` pods.
        ``node_shapes`` groups nodes whose GPUs are alike; without it none are."""
        pod_kinds: dict[tuple[PodGpuRequest, HostRequest], int] = {}
        pod_shapes = tuple(pod_kinds.setdefault((p.request, p.host), len(pod_kinds)) for p in pods)
        gpus_per_model: dict[str, int] = {}
        for gpu in (g for state in states for g in state.gpus):
            gpus_per_model[gpu.model] = gpus_per_model.get(gpu.model, 0) + 1
        cpu_milli = sum(s.host.cpu_milli for s in states if s.host is not None)
        return Scenario(
            states=tuple(states),
            pods=tuple(pods),
            node_shapes=tuple(range(len(states)) if node_shapes is None else node_shapes),
            pod_shapes=pod_shapes,
            requests=tuple(pod_kinds),
            workload=with_cluster(typical, gpus_per_model, cpu_milli),
            capacity_milli=sum(len(s.gpus) for s in states) * MILLI_GPU,
            gpus_per_model=tuple(sorted(gpus_per_model.items())),
            cpu_milli=cpu_milli,
            learned=learned,
            alike=node_shapes is not None,
        )

    def cluster(self) -> tuple[dict[str, int], int]:
        """(GPUs of each model, CPU millicores in all): what the extender reads of its nodes."""
        return dict(self.gpus_per_model), self.cpu_milli


@dataclass(frozen=True, slots=True)
class RunResult:
    """One policy on one seed: pods replayed, how many failed, time taken, the curves.

    ``evaluations`` counts the fits the core ran (each with a score when it fit).
    ``learned`` says whether the policy learned its workload from the pods.
    """

    policy: str
    seed: int
    pods: int
    failed_pods: int
    seconds: float
    evaluations: int
    curves: Curves
    learned: bool = False


@dataclass(frozen=True, slots=True)
class Played:
    """A replay pod by pod: a measurement after each arrival, where each pod went (a node
    name, or None when it failed), how many fits the core ran, and the nodes as the
    replay left them (in the arrivals' node order)."""

    measurements: tuple[Measurement, ...]
    placed_on: tuple[str | None, ...]
    evaluations: int
    learned: bool
    nodes: tuple[NodeState, ...]


def play(scenario: Scenario, policy: SimPolicy, order: Arrivals, cache: bool = True) -> Played:
    """Give each arriving pod one attempt under ``policy``; nothing departs."""
    run = _Run(scenario, policy, order, cache)
    measurements = run.play()
    evaluations = run.node_set.evaluations
    learned = run.learned is not None
    return Played(tuple(measurements), tuple(run.placed_on), evaluations, learned, tuple(run.nodes))


def replay(
    scenario: Scenario,
    policy: SimPolicy,
    seed: int,
    inflation: float = DEFAULT_INFLATION,
    cache: bool = True,
) -> RunResult:
    """Replay ``seed``'s arrivals under ``policy`` and measure after every pod."""
    started = time.perf_counter()
    order = arrivals(len(scenario.states), scenario.pods, scenario.capacity_milli, seed, inflation)
    played = play(scenario, policy, order, cache)
    return RunResult(
        policy=policy.name,
        seed=seed,
        pods=len(order.pods),
        failed_pods=played.placed_on.count(None),
        seconds=time.perf_counter() - started,
        evaluations=played.evaluations,
        curves=curves(played.measurements),
        learned=played.learned,
    )


def learns(scenario: Scenario, policy: SimPolicy) -> bool:
    """Whether ``policy`` learns its workload in this scenario: the production policies that
    read one do, unless the scenario feeds them the trace's."""
    return scenario.learned and policy.core in LEARNING


def _percent(milli: int, capacity_milli: int) -> float:
    """``milli`` as % of the GPUs; 0 of none (a what-if's nodes may publish none)."""
    return 100.0 * milli / capacity_milli if capacity_milli else 0.0


class _Run:
    """The state of one replay: nodes by position in the seed's order, grouped by signature,
    and held in the node set under their signatures."""

    def __init__(self, scenario: Scenario, policy: SimPolicy, order: Arrivals, cache: bool) -> None:
        self.scenario = scenario
        self.sim = policy
        self.order = order
        self.cache = cache
        self.learned = LearnedWorkload(scenario.cluster) if learns(scenario, policy) else None
        self.policy = resolve_policy(policy.core, scenario.workload)
        self.salts = random.Random(f"{order.seed}/salt")
        self.picks = random.Random(f"{order.seed}/pick")
        self.nodes = [scenario.states[i] for i in order.node_order]
        self.shapes = [scenario.node_shapes[i] for i in order.node_order]
        self.alike = scenario.alike
        self.signatures = [self._signature(p) for p in range(len(self.nodes))]
        self.node_set = NodeSet(indexed=False)  # pods carry CPU: the exact core answers
        self.groups: dict[Signature, set[int]] = {}
        self.names: dict[Signature, str] = {}
        """The name of one member of each group, in the groups' order: the one asked."""
        for position, signature in enumerate(self.signatures):
            self.node_set.put(self.nodes[position], self._key(position, signature))
            self._join(position, signature)
        self.fragments: dict[Signature, tuple[float, float]] = {}
        self.failed = 0
        self.placed_on: list[str | None] = []

    def play(self) -> list[Measurement]:
        frag_idle = [self._fragment(p) for p in range(len(self.nodes))]
        frag = sum(f for f, _ in frag_idle)
        idle = sum(i for _, i in frag_idle)
        capacity = self.scenario.capacity_milli
        arrived = allocated = 0
        out: list[Measurement] = []
        for arrival, pod_index in enumerate(self.order.pods):
            shape = self.scenario.pod_shapes[pod_index]
            milli = self.scenario.pods[pod_index].gpu_request_milli
            arrived += milli
            policy = self._policy(arrival, shape)
            position = self._choose(shape, policy)
            self.placed_on.append(None if position is None else self.nodes[position].name)
            if position is None:
                self.failed += 1
            else:
                old = frag_idle[position]
                self._place(position, shape, policy)
                frag_idle[position] = new = self._fragment(position)
                frag += new[0] - old[0]
                idle += new[1] - old[1]
                allocated += milli
            rate = fragmentation_rate(frag, idle)
            arrived_pct, allocated_pct = _percent(arrived, capacity), _percent(allocated, capacity)
            out.append(Measurement(arrived_pct, allocated_pct, rate, self.failed))
        return out

    def _policy(self, arrival: int, shape: int) -> Policy:
        """The policy as the extender resolves it for this pod: having seen it first, with
        the workload learned so far (or the trace's, which never changes)."""
        if self.learned is None:
            return self.policy
        self.learned.observe(str(arrival), *self.scenario.requests[shape])
        workload = self.learned.workload()
        if workload is not self.policy.workload:
            self.policy = resolve_policy(self.sim.core, workload)
        return self.policy

    def _signature(self, position: int) -> Signature:
        node = self.nodes[position]
        host = node.host
        held = [
            (g.assigned_mib, g.assigned_cores, g.shares, g.holders, tuple(m.taken for m in g.mig))
            for g in node.gpus
        ]
        requested = (host.requested_cpu_milli, host.requested_memory_mib) if host else (0, 0)
        return (self.shapes[position], *requested, tuple(sorted(held) if self.alike else held))

    def _key(self, position: int, signature: Signature) -> object:
        """The node's key in the node set: its signature, shared by nodes alike; without
        the cache, its own."""
        return signature if self.cache else (position, signature)

    def _choose(self, shape: int, policy: Policy) -> int | None:
        """The position the pod goes to, or None when no node fits: the node set scores
        one node per group (every node, without the cache), the pick compares rounded."""
        if self.cache:
            names = list(self.names.values())
            members = list(self.groups.values())
        else:
            names = [node.name for node in self.nodes]
            members = [{p} for p in range(len(self.nodes))]
        request, host = self.scenario.requests[shape]
        raw = self.node_set.scores(names, request, policy, host)
        fitting = np.flatnonzero(~np.isnan(raw)).tolist()
        if not fitting:
            return None
        rounded = [self._rounded(r) for r in raw[fitting].tolist()]
        best = max(rounded)
        tied = [members[at] for at, r in zip(fitting, rounded, strict=True) if r == best]
        if self.sim.tie_break == "order":
            return min(min(group) for group in tied)
        positions = sorted(p for group in tied for p in group)
        return positions[self.picks.randrange(len(positions))]

    def _rounded(self, raw: float) -> float:
        return math.floor(raw) if self.sim.integer_scores else round(raw, SCORE_DIGITS)

    def _place(self, position: int, shape: int, policy: Policy) -> None:
        request, host = self.scenario.requests[shape]
        salted = replace(policy, salt=self.salts.getrandbits(32))
        after = self.node_set.place(self.nodes[position].name, request, salted, host).after
        if after is None:  # the pick only offers nodes that fit
            raise AssertionError(f"position {position} was picked but does not fit")
        self.nodes[position] = after
        old, new = self.signatures[position], self._signature(position)
        self.signatures[position] = new
        self.node_set.put(after, self._key(position, new))
        self._leave(position, old)
        self._join(position, new)

    def _join(self, position: int, signature: Signature) -> None:
        """Put the node in its signature's group; a new group is named by it."""
        group = self.groups.get(signature)
        if group is None:
            group = self.groups[signature] = set()
            self.names[signature] = self.nodes[position].name
        group.add(position)

    def _leave(self, position: int, signature: Signature) -> None:
        """Take the node out of its group, which another member names from now on (groups
        and names are changed together, so they list signatures in the same order)."""
        group = self.groups[signature]
        group.discard(position)
        if not group:
            del self.groups[signature], self.names[signature]
        elif self.names[signature] == self.nodes[position].name:
            self.names[signature] = self.nodes[next(iter(group))].name

    def _fragment(self, position: int) -> tuple[float, float]:
        """(F_n, idle(n)) of the node, in milli-GPUs, over the typical pods."""
        signature = self.signatures[position]
        known = self.fragments.get(signature)
        if known is None:
            known = self.fragments[signature] = node_fragment(
                self.nodes[position], self.scenario.workload
            )
        return known
