"""Tentative reservations: a burst placed without waiting for binds.

kube-scheduler binds asynchronously, so pod B is filtered and scored while pod A's bind is
still on its way. In the InferGrid profile the extender's score decides the node, so the
extender knows where A will go as soon as it has scored A: prioritize holds A's placement on
the node it ranks first, at once, in the cache that B's filter and prioritize read. Bind on
that node confirms it (after the usual read-back checks); bind on another node moves it; no
bind within `tentativeReservationSeconds` releases it, and so does the watch when the pod is
deleted or bound by someone else.

Among nodes tied at the top score kube-scheduler picks one at random, so the node reserved on
keeps its score and the others tied with it get one less: the prediction then holds wherever
the extender's score decides. Where only one node passes filter, kube-scheduler binds it
without asking prioritize, so filter holds the placement there.

The decisions (which node, when a hold runs out, what a bind does with it) are pure functions;
`Reserver` applies them to the cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import compress, islice, repeat
from typing import Any, Literal

from infergrid.errors import ContractError
from infergrid.placement import NodeState, fit, resolve_policy, to_pod_assignment
from infergrid.pod_request import PodGpuRequest
from scheduler_extender import metrics
from scheduler_extender.view import PlacementView

BindOutcome = Literal["place", "confirm", "move"]
"""What bind does with a pod's tentative reservation: none is held, so place the pod
(`place`); keep it (`confirm`); or release it and place the pod on the bind's node (`move`).
A kept one is kept only while the read-back pod asks for what it was placed from."""


def deadline(now: float, timeout_s: float) -> float:
    """When a hold made at `now` runs out (the cache's `is_due` says when that is reached)."""
    return now + timeout_s


def bind_outcome(held_node: str | None, bind_node: str) -> BindOutcome:
    """What bind on `bind_node` does with the pod's hold on `held_node` (None: no hold)."""
    if held_node is None:
        return "place"
    return "confirm" if held_node == bind_node else "move"


def predicted_node(scores: Mapping[str, int]) -> tuple[str | None, list[str]]:
    """The node kube-scheduler will bind when the extender's score decides: the first with the
    top score, in the order asked about (None when no node scores above 0: none fits); and
    the other nodes tied with it."""
    values = list(scores.values())
    top = max(values, default=0)
    if top <= 0:
        return None, []
    if values.count(top) == 1:  # the common case, found in C without a pass in Python
        return next(islice(scores, values.index(top), None)), []
    tied = list(compress(scores, map(top.__eq__, values)))
    return tied[0], tied[1:]


def sole_top(scores: dict[str, int], tied: Sequence[str]) -> dict[str, int]:
    """`scores` with each of `tied` (the nodes tied with the chosen one) one lower, so the
    chosen node alone scores the top. The order among all other nodes is kept."""
    if not tied:
        return scores
    lower = dict(scores)
    lower.update(zip(tied, repeat(scores[tied[0]] - 1)))
    return lower


@dataclass
class Reserver:
    """Holds, forgets and expires tentative reservations in the view's cache."""

    view: PlacementView
    default_policy: str
    timeout_s: float
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    monotonic: Callable[[], float] = time.monotonic

    def expire(self) -> None:
        """Releases the holds whose bind did not come in time."""
        gone = self.view.cache.expire_tentative(self.monotonic())
        if gone:
            metrics.TENTATIVE_RESERVATIONS.labels("expired").inc(len(gone))

    def forget(self, uid: str) -> None:
        """A new scheduling cycle of the pod: it must not be weighed against its own hold."""
        if self.view.cache.release_tentative(uid):
            metrics.TENTATIVE_RESERVATIONS.labels("released").inc()

    def hold(self, pod: dict[str, Any], uid: str, node: str) -> bool:
        """Holds the pod's placement on `node`; False where there is none to hold (no GPU
        container, an invalid request, no longer fits, a bind already holds the pod)."""
        try:
            request = self.view.request_of(pod, self.default_policy)
        except ContractError:
            return False
        if not request.gpu_containers:
            return False
        now = self.clock()
        state = self.view.node_state(node, now)
        if isinstance(state, str):
            return False
        until = deadline(self.monotonic(), self.timeout_s)
        held = hold_fitted(self.view, pod, uid, request, state, now, until)
        if held:
            metrics.TENTATIVE_RESERVATIONS.labels("made").inc()
        return held


def hold_fitted(
    view: PlacementView,
    pod: dict[str, Any],
    uid: str,
    request: PodGpuRequest,
    state: NodeState,
    now: datetime,
    until: float,
) -> bool:
    """Holds, in the view's cache until `until`, where `fit` places the pod on `state` (the
    node as it is, or as it will be: preemption holds the room its victims leave); False
    where it does not fit, or a bind already holds the pod."""
    result = fit(request, state, resolve_policy(request.policy, view.workload()))
    if not result.fits:
        return False
    meta = pod.get("metadata") or {}
    return view.cache.hold(
        uid,
        str(meta.get("namespace") or ""),
        str(meta.get("name") or ""),
        to_pod_assignment(state.name, result.placements, now),
        request,
        until,
    )
