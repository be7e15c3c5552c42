"""Preemption the extender leads, for pods that contend for GPU memory and SM shares alone.

kube-scheduler's own preemption acts on a node only when its dry run, which counts CPU,
memory and device counts but never `infergrid.io/gpu-memory` or SM shares, finds victims
there; it asks the preempt verb (`decisions.preempt_nodes`) about those nodes alone. Where
pods contend for GPU memory only, the dry run finds none, so nothing would ever be evicted
for an online pod that finds every GPU filled by offline shares.

So when filter passes no node for a pod that may preempt (a priority above some holder's,
and `preemptionPolicy` not `Never`), the extender chooses the node and victims itself
(`cheapest_node` over the nodes that refused it, among holders of a preemptible class only:
the `preemptibleClasses` setting), evicts them through the Eviction API, which
honours PodDisruptionBudgets, and holds the freed GPUs for the pod with a tentative
reservation, so the victims' replacements, of lower priority, cannot take them back. While
its victims are still there (terminating), each new filter of the pod renews the hold and
evicts no one else. The decision is `plan`, over the cache; filter (`app.py`) applies it.

The same holds for pods whose GPUs come by claim on DRA nodes: kube-scheduler cannot preempt
for DRA devices at all. Their allocated claims are GPU holders in the cache like assignments
(charged to the one pod each is reserved for), so the same plan evicts them and holds the room.

A plan whose eviction is refused (for a reason a deletion cannot get past: RBAC, an admission
policy) is given up, and so is preemption for that pod until something changes: the victim
it could not evict goes, or `retry_s` pass. Without that, each new filter of the pod would plan
again and evict another victim's replacement, for as long as the pod waited.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from infergrid.assignment_annotation import PodAssignment
from infergrid.errors import ContractError
from infergrid.placement import Holder, cheapest_node, resolve_policy
from infergrid.placement import without as without_victims
from infergrid.pod_request import PodGpuRequest
from infergrid.records import PodRecord, pod_priority
from scheduler_extender import metrics
from scheduler_extender.config import DEFAULT_PREEMPTIBLE
from scheduler_extender.tentative import hold_fitted
from scheduler_extender.view import PlacementView
from scheduler_extender.watch_cache import ClusterCache

log = logging.getLogger(__name__)

Evict = Callable[[str, str, str], Awaitable[str | None]]
"""Evicts the pod (namespace, name, uid); returns why not (a budget, a race), or None."""
Announce = Callable[["PodRef", str, str, str], Awaitable[None]]
"""Records an Event (reason, message, type) on the pod, as kube-scheduler does for its
preemption."""
EVENT_SOURCE = "infergrid-scheduler-extender"


@dataclass(frozen=True, slots=True)
class PodRef:
    uid: str
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class GivenUp:
    """Why preemption stopped for a pod: the victim whose eviction was refused, and when the
    pod may plan again even if that victim stays."""

    victim: str
    until: float


@dataclass(frozen=True, slots=True)
class Plan:
    """Where the preemptor goes and whom that takes; `evict` is False when these victims were
    chosen by an earlier filter and are still terminating."""

    node: str
    victims: tuple[PodRef, ...]
    evict: bool


REASON_GIVEN_UP = "PreemptionGivenUp"
"""The Warning event on a pod whose preemption stopped, naming the refused victim and why."""

BUDGET_REFUSAL = 429
"""What the Eviction API answers when a PodDisruptionBudget allows no disruption now."""


def evictor(core: client.CoreV1Api) -> Evict:
    """Evictions through the API server's Eviction subresource, for this pod uid only (a pod
    made again under the same name is not evicted in its place).

    A PodDisruptionBudget is honoured as kube-scheduler's own preemption honours it: on a
    best-effort basis. An eviction it refuses becomes a deletion (with the pod's grace
    period). Otherwise an InferenceService's own budget (one pod at a time, for rollouts)
    would keep an online pod waiting for good behind two offline shares of one service:
    the first eviction's replacement stays Pending, so the budget never allows the second.
    """

    async def evict(namespace: str, name: str, uid: str) -> str | None:
        preconditions = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid))
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            delete_options=preconditions,
        )
        try:
            await asyncio.to_thread(core.create_namespaced_pod_eviction, name, namespace, body)
            return None
        except ApiException as err:
            if err.status != BUDGET_REFUSAL:
                return f"{err.status} {err.reason}"
        log.info("a disruption budget refused evicting %s/%s; deleting it, as kube-scheduler's "
                 "preemption does", namespace, name)  # fmt: skip
        try:
            await asyncio.to_thread(core.delete_namespaced_pod, name, namespace, body=preconditions)
        except ApiException as err:
            return f"{err.status} {err.reason}"
        return None

    return evict


def announcer(core: client.CoreV1Api) -> Announce:
    """Events through the API server; a failure is logged and never stops a preemption."""

    async def announce(pod: PodRef, reason: str, message: str, kind: str = "Normal") -> None:
        now = datetime.now(UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{pod.name}.", namespace=pod.namespace),
            involved_object=client.V1ObjectReference(
                kind="Pod", api_version="v1", namespace=pod.namespace, name=pod.name, uid=pod.uid
            ),
            reason=reason, message=message, type=kind, count=1,
            first_timestamp=now, last_timestamp=now,
            source=client.V1EventSource(component=EVENT_SOURCE),
        )  # fmt: skip
        try:
            await asyncio.to_thread(core.create_namespaced_event, pod.namespace, body)
        except ApiException as err:
            log.warning("event %s on %s/%s not recorded: %s %s", reason, pod.namespace,
                        pod.name, err.status, err.reason)  # fmt: skip

    return announce


def split_holders(
    cache: ClusterCache, node: str, leaving: set[str]
) -> tuple[list[Holder], list[Holder]]:
    """The node's GPU holders in `leaving` (evicted already, or proposed by kube-scheduler),
    and the others that may still be chosen: a bind under way, whose pod event has not come
    (no priority yet), never is."""
    held = cache.holders_on(node)
    gone = [_holder(uid, pod, a) for uid, pod, a in held if uid in leaving]
    others = [_holder(uid, pod, a) for uid, pod, a in held
              if uid not in leaving and pod is not None]  # fmt: skip
    return gone, others


def _holder(uid: str, pod: PodRecord | None, assignment: PodAssignment) -> Holder:
    if pod is None:
        return Holder(uid, 0, assignment.containers)
    return Holder(uid, pod.priority, assignment.containers, pod.priority_class)


def may_preempt(pod: dict[str, Any]) -> bool:
    """A pod with a priority above the default that does not refuse to preempt."""
    spec = pod.get("spec") or {}
    return pod_priority(pod) > 0 and spec.get("preemptionPolicy") != "Never"


class Preemptor:
    """Plans preemption for pods no node takes, holds their room, and evicts their victims."""

    def __init__(
        self,
        view: PlacementView,
        default_policy: str,
        evict: Evict,
        announce: Announce,
        hold_s: float = 60.0,
        monotonic: Callable[[], float] = time.monotonic,
        retry_s: float = 600.0,
        preemptible: frozenset[str] = DEFAULT_PREEMPTIBLE,
    ) -> None:
        self.view = view
        self.default_policy = default_policy
        self.evict = evict
        self.announce = announce
        self.hold_s = hold_s
        self.monotonic = monotonic
        self.retry_s = retry_s
        self.preemptible = preemptible
        # preemptor uid -> its plan, and when it was made: one plan a pod per hold window
        self._under_way: dict[str, tuple[Plan, float]] = {}
        # preemptor uid -> why its preemption stopped, until something changes
        self._given_up: dict[str, GivenUp] = {}

    def plan(self, pod: dict[str, Any], refused: list[str], now: datetime) -> Plan | None:
        """The preemption for `pod`, which every node in `refused` turned down; None where it
        may not preempt, or no eviction anywhere makes room. Holds the room it plans."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not uid or not may_preempt(pod):
            return None
        try:
            request = self.view.request_of(pod, self.default_policy)
        except ContractError:
            return None
        if not request.gpu_containers or self.stopped(uid):
            return None
        self._settle()
        earlier, made = self._under_way.pop(uid, (None, self.monotonic()))
        if earlier is not None:
            plan = Plan(earlier.node, earlier.victims, evict=False)
        else:
            plan = self._choose(request, pod_priority(pod), refused, now)
        if plan is None:
            return None
        if not self._hold(pod, uid, request, plan, now):
            if earlier is not None:
                self._under_way[uid] = (plan, made)  # keep waiting out the window
            return None
        self._under_way[uid] = (plan, made)
        return plan

    def stopped(self, uid: str) -> bool:
        """Whether preemption for the pod stays given up: the victim it could not evict is
        still there, and the retry time has not come. Forgets it once either changes."""
        given_up = self._given_up.get(uid)
        if given_up is None:
            return False
        if self.view.cache.pod(given_up.victim) is not None and self.monotonic() < given_up.until:
            return True
        del self._given_up[uid]
        return False

    def new_cycle(self, uid: str) -> None:
        """Before a pod is filtered again: holds past their time go, and so does its own, so
        it is not weighed against the room held for it."""
        self.view.cache.expire_tentative(self.monotonic())
        self.view.cache.release_tentative(uid)

    def _settle(self) -> None:
        """Forgets the plans older than the hold. Until then a pod refused again keeps its
        plan, whose victims may already be gone (the room is then renewed, or, taken after
        all, waited for), and evicts no one else: at most one preemption a pod per window,
        whatever races between the evictions, the replacements and its own retries."""
        now = self.monotonic()
        for uid, (_, made) in list(self._under_way.items()):
            if now - made >= self.hold_s:
                del self._under_way[uid]
        for uid, given_up in list(self._given_up.items()):  # pods never filtered again
            if now >= given_up.until:
                del self._given_up[uid]

    async def evict_all(self, pod: dict[str, Any], plan: Plan) -> None:
        """The evictions `plan` asks for, one after another (after filter has answered). A
        refused one ends the plan, frees its room (a victim that stays would otherwise keep
        it held for good) and stops preemption for the pod until something changes."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        preemptor = PodRef(uid, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        who = f"{preemptor.namespace}/{preemptor.name}"
        listed = ", ".join(f"{v.namespace}/{v.name}" for v in plan.victims)
        log.info("preempting %d pod(s) on %s for %s: %s", len(plan.victims), plan.node, who,
                 listed)  # fmt: skip
        await self.announce(preemptor, "Preempting",
                            f"evicting {listed} on {plan.node} for GPU room")  # fmt: skip
        for victim in plan.victims:
            refused_why = await self.evict(victim.namespace, victim.name, victim.uid)
            outcome = "evicted" if refused_why is None else "refused"
            metrics.PREEMPTION_EVICTIONS.labels(outcome).inc()
            if refused_why is not None:
                await self._give_up(preemptor, victim, refused_why)
                return
            why = f"by {who}, which needs its GPU room on {plan.node}"
            await self.announce(victim, "Preempted", why)

    async def _give_up(self, preemptor: PodRef, victim: PodRef, refused_why: str) -> None:
        """Ends the pod's plan, frees its room, and stops preemption for it (`stopped`)."""
        self._under_way.pop(preemptor.uid, None)
        self.view.cache.release_tentative(preemptor.uid)
        self._given_up[preemptor.uid] = GivenUp(victim.uid, self.monotonic() + self.retry_s)
        metrics.PREEMPTIONS_GIVEN_UP.inc()
        message = (f"eviction of {victim.namespace}/{victim.name} refused ({refused_why}); "
                   f"no more evictions for this pod until that pod is gone or "
                   f"{self.retry_s:.0f} s pass")  # fmt: skip
        log.warning("preemption for %s/%s given up: %s", preemptor.namespace, preemptor.name,
                    message)  # fmt: skip
        await self.announce(preemptor, REASON_GIVEN_UP, message, "Warning")

    def _choose(
        self, request: PodGpuRequest, priority: int, refused: list[str], now: datetime
    ) -> Plan | None:
        nodes, names = [], {}
        for name in refused:
            state = self.view.node_state(name, now)
            if isinstance(state, str):
                continue
            holders = []
            for holder in split_holders(self.view.cache, name, set())[1]:
                record = self.view.cache.pod(holder.uid)
                if record is not None:  # not gone since
                    holders.append(holder)
                    names[holder.uid] = PodRef(holder.uid, record.namespace, record.name)
            nodes.append((state, holders))
        policy = resolve_policy(request.policy, self.view.workload())
        chosen = cheapest_node(request, nodes, priority, policy, self.preemptible)
        if chosen is None:
            return None
        node, victims = chosen
        return Plan(node, tuple(names[v.uid] for v in victims), evict=True)

    def _hold(
        self, pod: dict[str, Any], uid: str, request: PodGpuRequest, plan: Plan, now: datetime
    ) -> bool:
        """Holds the pod's placement on the plan's node as it will be once its victims go."""
        state = self.view.node_state(plan.node, now)
        if isinstance(state, str):
            return False
        victims, _ = split_holders(self.view.cache, plan.node, {v.uid for v in plan.victims})
        after = without_victims(state, victims)
        return hold_fitted(self.view, pod, uid, request, after, now, self.monotonic() + self.hold_s)
