"""Replaying one seed's arrivals, pod by pod, through the placement core.

For each pod the replay does what kube-scheduler and the extender do together:
``fit`` on every node (GPUs, and the pod's CPU, memory and GPU models), the
policy's raw scorer on every node that fits, then the pick (``SimPolicy``); the
chosen node becomes ``fit(...).after``. Nothing here decides placement.

It is fast because nodes that look alike to placement are asked once. A node's
signature is everything fit and the scorers read of it: its shape (model, GPU
count, CPU, memory), its CPU and memory requested, and the multiset of its
GPUs' holdings (GPU order does not matter: the simulated GPUs are alike, and
neither the fits nor any scorer reads names or indices, only ties among equal
GPUs do, and equal GPUs give equal results). Nodes are kept in groups by
signature, and (signature, pod shape) → verdict is remembered for the whole run,
so a pod costs one lookup per distinct node state, and the core runs only for
states it has not seen with that shape. ``cache=False`` asks the core about
every node, for tests that check both agree.
"""

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from infergrid.placement import (
    HostRequest,
    NodeState,
    Workload,
    fit,
    free_capacity,
    node_fragmentation,
    resolve_policy,
    with_cluster,
)
from infergrid.pod_request import PodGpuRequest
from infergrid.simulate.arrivals import DEFAULT_INFLATION, Arrivals, arrivals
from infergrid.simulate.cluster import node_state, pod_request
from infergrid.simulate.metrics import Curves, Measurement, curves
from infergrid.simulate.policies import SimPolicy, typical_workload
from infergrid.simulate.trace import MILLI_GPU, TraceNode, TracePod

SCORE_DIGITS: Final = 9
"""Raw scores equal to this many decimals tie, as in the core's GPU choice."""

_UNSEEN: Final = object()

Signature = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class Scenario:
    """A trace ready to replay: node states built once, pods grouped by shape.

    ``requests`` holds each pod shape's request as the core sees it, and
    ``workload`` the trace's typical pods (fgd's workload and the metric's M),
    with how contested each GPU model of these nodes is and their CPU per GPU
    (fgd-cluster-aware reads both).
    """

    nodes: tuple[TraceNode, ...]
    pods: tuple[TracePod, ...]
    states: tuple[NodeState, ...]
    node_shapes: tuple[int, ...]
    pod_shapes: tuple[int, ...]
    requests: tuple[tuple[PodGpuRequest, HostRequest], ...]
    workload: Workload
    capacity_milli: int

    @staticmethod
    def of(nodes: Sequence[TraceNode], pods: Sequence[TracePod]) -> "Scenario":
        node_kinds: dict[tuple[object, ...], int] = {}
        node_shapes = tuple(
            node_kinds.setdefault((n.model, n.gpus, n.cpu_milli, n.memory_mib), len(node_kinds))
            for n in nodes
        )
        pod_kinds: dict[tuple[object, ...], int] = {}
        pod_shapes = tuple(pod_kinds.setdefault(p.shape, len(pod_kinds)) for p in pods)
        first = {shape: pod for shape, pod in zip(pod_shapes, pods, strict=True)}
        gpus_per_model: dict[str, int] = {}
        for node in nodes:
            gpus_per_model[node.model] = gpus_per_model.get(node.model, 0) + node.gpus
        return Scenario(
            nodes=tuple(nodes),
            pods=tuple(pods),
            states=tuple(node_state(n) for n in nodes),
            node_shapes=node_shapes,
            pod_shapes=pod_shapes,
            requests=tuple(pod_request(first[s]) for s in range(len(pod_kinds))),
            workload=with_cluster(
                typical_workload(pods), gpus_per_model, sum(n.cpu_milli for n in nodes)
            ),
            capacity_milli=sum(n.gpus for n in nodes) * MILLI_GPU,
        )


@dataclass(frozen=True, slots=True)
class RunResult:
    """One policy on one seed: pods replayed, how many failed, time taken, the curves.

    ``evaluations`` counts the fits the core ran (each with a score when it fit).
    """

    policy: str
    seed: int
    pods: int
    failed_pods: int
    seconds: float
    evaluations: int
    curves: Curves


@dataclass(frozen=True, slots=True)
class Played:
    """A replay pod by pod: a measurement after each arrival, where each pod went (a node
    name, or None when it failed), and how many fits the core ran."""

    measurements: tuple[Measurement, ...]
    placed_on: tuple[str | None, ...]
    evaluations: int


def play(scenario: Scenario, policy: SimPolicy, order: Arrivals, cache: bool = True) -> Played:
    """Give each arriving pod one attempt under ``policy``; nothing departs."""
    run = _Run(scenario, policy, order, cache)
    measurements = run.play()
    return Played(tuple(measurements), tuple(run.placed_on), run.evaluations)


def replay(
    scenario: Scenario,
    policy: SimPolicy,
    seed: int,
    inflation: float = DEFAULT_INFLATION,
    cache: bool = True,
) -> RunResult:
    """Replay ``seed``'s arrivals under ``policy`` and measure after every pod."""
    started = time.perf_counter()
    order = arrivals(len(scenario.nodes), scenario.pods, scenario.capacity_milli, seed, inflation)
    played = play(scenario, policy, order, cache)
    return RunResult(
        policy=policy.name,
        seed=seed,
        pods=len(order.pods),
        failed_pods=played.placed_on.count(None),
        seconds=time.perf_counter() - started,
        evaluations=played.evaluations,
        curves=curves(played.measurements),
    )


class _Group:
    """Nodes that share a signature, and what the core said about them for each pod shape."""

    __slots__ = ("members", "verdicts")

    def __init__(self) -> None:
        self.members: set[int] = set()
        self.verdicts: dict[int, float | None] = {}


class _Run:
    """The state of one replay: nodes by position in the seed's order, grouped by signature."""

    def __init__(self, scenario: Scenario, policy: SimPolicy, order: Arrivals, cache: bool) -> None:
        self.scenario = scenario
        self.sim = policy
        self.order = order
        self.cache = cache
        self.policy = resolve_policy(policy.core, scenario.workload)
        self.salts = random.Random(f"{order.seed}/salt")
        self.picks = random.Random(f"{order.seed}/pick")
        self.nodes = [scenario.states[i] for i in order.node_order]
        self.shapes = [scenario.node_shapes[i] for i in order.node_order]
        self.signatures = [self._signature(p) for p in range(len(self.nodes))]
        self.known: dict[Signature, _Group] = {}
        self.groups: dict[Signature, _Group] = {}
        for position, signature in enumerate(self.signatures):
            self._join(position, signature)
        self.fragments: dict[Signature, tuple[float, float]] = {}
        self.evaluations = 0
        self.failed = 0
        self.placed_on: list[str | None] = []

    def play(self) -> list[Measurement]:
        frag_idle = [self._fragment(p) for p in range(len(self.nodes))]
        frag = sum(f for f, _ in frag_idle)
        idle = sum(i for _, i in frag_idle)
        capacity = self.scenario.capacity_milli
        arrived = allocated = 0
        out: list[Measurement] = []
        for pod_index in self.order.pods:
            shape = self.scenario.pod_shapes[pod_index]
            milli = self.scenario.pods[pod_index].gpu_request_milli
            arrived += milli
            position = self._choose(shape)
            self.placed_on.append(None if position is None else self.nodes[position].name)
            if position is None:
                self.failed += 1
            else:
                old = frag_idle[position]
                self._place(position, shape)
                frag_idle[position] = new = self._fragment(position)
                frag += new[0] - old[0]
                idle += new[1] - old[1]
                allocated += milli
            rate = 100.0 * frag / idle if idle > 0 else 0.0
            arrived_pct, allocated_pct = 100.0 * arrived / capacity, 100.0 * allocated / capacity
            out.append(Measurement(arrived_pct, allocated_pct, rate, self.failed))
        return out

    def _signature(self, position: int) -> Signature:
        node = self.nodes[position]
        host = node.host
        held = sorted((g.assigned_mib, g.assigned_cores, g.shares, g.exclusive) for g in node.gpus)
        requested = (host.requested_cpu_milli, host.requested_memory_mib) if host else (0, 0)
        return (self.shapes[position], *requested, tuple(held))

    def _verdict(self, node: NodeState, shape: int) -> float | None:
        """The node's score for the pod shape as the pick compares it; None if it does not fit."""
        self.evaluations += 1
        request, host = self.scenario.requests[shape]
        result = fit(request, node, self.policy, host)
        after = result.after
        if after is None:
            return None
        raw = self.policy.raw_score(node, after, self.policy.workload)
        return math.floor(raw) if self.sim.integer_scores else round(raw, SCORE_DIGITS)

    def _choose(self, shape: int) -> int | None:
        """The position the pod goes to, or None when no node fits."""
        best: float | None = None
        tied: list[set[int]] = []
        for score, members in self._scored(shape):
            if score is None:
                continue
            if best is None or score > best:
                best, tied = score, [members]
            elif score == best:
                tied.append(members)
        if best is None:
            return None
        if self.sim.tie_break == "order":
            return min(min(group) for group in tied)
        positions = sorted(p for group in tied for p in group)
        return positions[self.picks.randrange(len(positions))]

    def _scored(self, shape: int) -> list[tuple[float | None, set[int]]]:
        """(verdict, positions) for every node: by group, asking the core once per signature
        and pod shape; or, without the cache, node by node."""
        if not self.cache:
            return [(self._verdict(node, shape), {p}) for p, node in enumerate(self.nodes)]
        out = []
        for group in self.groups.values():
            verdicts = group.verdicts
            score = verdicts.get(shape, _UNSEEN)
            if score is _UNSEEN:
                score = verdicts[shape] = self._verdict(self.nodes[min(group.members)], shape)
            out.append((score, group.members))
        return out

    def _place(self, position: int, shape: int) -> None:
        request, host = self.scenario.requests[shape]
        policy = replace(self.policy, salt=self.salts.getrandbits(32))
        after = fit(request, self.nodes[position], policy, host).after
        if after is None:  # the pick only offers nodes that fit
            raise AssertionError(f"position {position} was picked but does not fit")
        self.nodes[position] = after
        old, new = self.signatures[position], self._signature(position)
        self.signatures[position] = new
        group = self.groups[old]
        group.members.discard(position)
        if not group.members:
            del self.groups[old]
        self._join(position, new)

    def _join(self, position: int, signature: Signature) -> None:
        """Put the node in its signature's group; a group keeps its verdicts while empty."""
        group = self.known.get(signature)
        if group is None:
            group = self.known[signature] = _Group()
        if not group.members:
            self.groups[signature] = group
        group.members.add(position)

    def _fragment(self, position: int) -> tuple[float, float]:
        """(F_n, idle(n)) of the node, in milli-GPUs, over the typical pods."""
        signature = self.signatures[position]
        known = self.fragments.get(signature)
        if known is None:
            node = self.nodes[position]
            known = (
                node_fragmentation(node, self.scenario.workload) * MILLI_GPU,
                sum(free_capacity(g) for g in node.gpus) * MILLI_GPU,
            )
            self.fragments[signature] = known
        return known
