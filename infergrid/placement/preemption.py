"""Preemption that understands GPU shares: which lower-priority pods to evict from a node so that
a pod fits there, as kube-scheduler's extender `preempt` verb asks.

kube-scheduler's own preemption cannot see `infergrid.io/gpu-memory`, SM shares or whole GPUs
held through the extender (it ignores the resources the extender manages), so the victims it
proposes may free nothing the pod needs, or be more than it needs. For each node it proposes,
the extender answers with a smallest set of lower-priority holders whose release lets `fit`
place the pod, or drops the node when even evicting them all would not.

Only holders whose PriorityClass is in the preemptible set may be victims: priority alone is
a number any pod in any namespace could claim, so the set (the cluster admin's, in the
extender's settings) says which work agreed to be evicted for GPU room. A pod with no class
is named by NO_CLASS.

A released holder's memory also comes off the GPU's measured use (`used_mib`): the process
goes with the pod, and without the discount the measured use of the very pods being evicted
would keep the GPU looking full.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Final

from infergrid.assignment_annotation import ContainerAssignment
from infergrid.placement.fit import fit
from infergrid.placement.policy import Policy
from infergrid.placement.reserve import release
from infergrid.placement.state import NodeState
from infergrid.pod_request import PodGpuRequest

EXACT_CANDIDATES: Final = 10
"""Up to this many lower-priority holders, every subset is tried, smallest first (at most 1023
fits); beyond, victims are taken greedily and then spared where the pod still fits."""
NO_CLASS: Final = ""
"""The class of a pod that names no PriorityClass, as a preemptible set lists it."""


@dataclass(frozen=True, slots=True)
class Holder:
    """A pod holding GPUs on the node: its uid, priority, what its containers hold, and its
    PriorityClass (NO_CLASS for none)."""

    uid: str
    priority: int
    containers: tuple[ContainerAssignment, ...]
    priority_class: str = NO_CLASS

    @property
    def held_mib(self) -> int:
        return sum(g.memory_mib for c in self.containers for g in c.gpus)


def choose_victims(
    request: PodGpuRequest,
    node: NodeState,
    holders: Sequence[Holder],
    priority: int,
    policy: Policy,
    preemptible: frozenset[str],
) -> tuple[str, ...] | None:
    """The uids to evict so that `request` (of `priority`) fits on `node`: () when it fits
    already, None when evicting every lower-priority holder of a class in `preemptible` would
    not make room.

    The set is as small as can be; among sets of that size, the one whose most important
    victim matters least, then whose priorities sum lowest, then that frees the least memory.
    """
    if fit(request, node, policy).fits:
        return ()
    candidates = sorted(
        (h for h in holders if h.priority < priority and h.priority_class in preemptible),
        key=lambda h: (h.priority, -h.held_mib, h.uid),
    )
    if not candidates or not _fits_without(request, node, candidates, policy):
        return None
    if len(candidates) <= EXACT_CANDIDATES:
        chosen = _smallest(request, node, candidates, policy)
    else:
        chosen = _greedy_then_spare(request, node, candidates, policy)
    return tuple(h.uid for h in chosen)


def cheapest_node(
    request: PodGpuRequest,
    nodes: Iterable[tuple[NodeState, Sequence[Holder]]],
    priority: int,
    policy: Policy,
    preemptible: frozenset[str],
) -> tuple[str, tuple[Holder, ...]] | None:
    """The node where `request` fits after the least disruption, and whom to evict there
    (`choose_victims` on each node; then fewest victims, least important ones, lowest
    priorities in all, and the node's name); None where no eviction anywhere makes room.
    A node where the pod fits already is not a preemption's to choose: the caller asks only
    about nodes that refused it."""
    best: tuple[tuple[int, int, int, str], str, tuple[Holder, ...]] | None = None
    for node, holders in nodes:
        uids = choose_victims(request, node, holders, priority, policy, preemptible)
        if not uids:
            continue
        chosen = tuple(h for h in holders if h.uid in uids)
        priorities = [h.priority for h in chosen]
        key = (len(chosen), max(priorities), sum(priorities), node.name)
        if best is None or key < best[0]:
            best = (key, node.name, chosen)
    return None if best is None else (best[1], best[2])


def without(node: NodeState, victims: Iterable[Holder]) -> NodeState:
    """`node` once `victims` are gone: their GPUs released and their memory off the measured
    use of each GPU they held."""
    victims = list(victims)
    freed: dict[str, int] = {}
    for victim in victims:
        for container in victim.containers:
            for gpu in container.gpus:
                freed[gpu.uuid] = freed.get(gpu.uuid, 0) + gpu.memory_mib
    released = release(node, (c for v in victims for c in v.containers))
    gpus = tuple(
        replace(g, used_mib=max(0, g.used_mib - freed[g.uuid])) if g.uuid in freed else g
        for g in released.gpus
    )
    return replace(released, gpus=gpus)


def _fits_without(
    request: PodGpuRequest, node: NodeState, victims: Sequence[Holder], policy: Policy
) -> bool:
    return fit(request, without(node, victims), policy).fits


def _smallest(
    request: PodGpuRequest, node: NodeState, candidates: list[Holder], policy: Policy
) -> list[Holder]:
    """Sets of each size in order of `_disruption`, up to the size of the greedy answer (a
    set of that size is known to make room), so the usual one or two victims cost a few
    dozen fits, not 2**n."""
    bound = len(_greedy_then_spare(request, node, candidates, policy))
    for size in range(1, bound + 1):
        sets = sorted(combinations(candidates, size), key=_disruption)
        for victims in sets:
            if _fits_without(request, node, victims, policy):
                return list(victims)
    return candidates  # unreachable: the caller checked that all of them make room


def _disruption(victims: tuple[Holder, ...]) -> tuple[int, int, int, tuple[str, ...]]:
    priorities = [v.priority for v in victims]
    freed = sum(v.held_mib for v in victims)
    return max(priorities), sum(priorities), freed, tuple(v.uid for v in victims)


def _greedy_then_spare(
    request: PodGpuRequest, node: NodeState, candidates: list[Holder], policy: Policy
) -> list[Holder]:
    """kube-scheduler's own way: evict in order (least important, largest first) until the pod
    fits, then spare each victim, most important first, whom the pod fits without."""
    victims: list[Holder] = []
    for holder in candidates:
        victims.append(holder)
        if _fits_without(request, node, victims, policy):
            break
    for holder in sorted(victims, key=lambda h: (-h.priority, h.held_mib, h.uid)):
        rest = [v for v in victims if v is not holder]
        if _fits_without(request, node, rest, policy):
            victims = rest
    return victims
