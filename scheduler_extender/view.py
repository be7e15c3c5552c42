"""Placement state per node, derived from the watch cache, and memoised decisions.

A node's NodeState depends on its annotations, the assignments on it and
whether its heartbeat is stale; the cache's per-node version plus the
staleness bit key it, so a filter over thousands of nodes rebuilds only the
few that moved since the last call. Fit results and raw scores are memoised
under the same key and the pod's shape, like kube-scheduler's old
equivalence cache: pods of one workload share a shape, so between two binds
almost every node answers from the memo. The decisions themselves are the
placement core's `fit` and the policy's scorer, never re-implemented here.
"""

from __future__ import annotations

from collections import deque
from datetime import datetime, timedelta
from typing import Final

from infergrid.placement import FitResult, NodeState, Policy, Workload, build_node_state, fit
from infergrid.pod_request import PodGpuRequest
from scheduler_extender.watch_cache import ClusterCache, NodeRecord

WORKLOAD_WINDOW: Final = 1000
WORKLOAD_REFRESH: Final = 50
"""FGD's request distribution is re-read after this many new pods, not after each one."""
MAX_SHAPES: Final = 4096

Decision = tuple[FitResult, float | None]
NodeKey = tuple[int, bool]


class PlacementView:
    def __init__(self, cache: ClusterCache, stale_after: timedelta):
        self.cache = cache
        self.stale_after = stale_after
        self._states: dict[str, tuple[NodeKey, NodeState]] = {}
        self._decisions: dict[str, tuple[NodeKey, dict[int, Decision]]] = {}
        self._shapes: dict[tuple, int] = {}
        self._recent: deque[PodGpuRequest] = deque(maxlen=WORKLOAD_WINDOW)
        self._seen: deque[str] = deque(maxlen=WORKLOAD_WINDOW)
        self._unread = 0
        self._workload = Workload.from_requests(())
        self._generation = 0

    def _why_none(self, name: str, record: NodeRecord | None) -> str | None:
        if record is None:
            return f"node {name} is not in the extender's cache"
        if record.problem:
            return f"node {name} has an unreadable GPU annotation: {record.problem}"
        if record.inventory is None:
            return f"node {name} publishes no GPU inventory (is the device plugin running?)"
        return None

    def _key(self, record: NodeRecord, version: int, now: datetime) -> NodeKey:
        usage = record.usage
        return (version, usage is None or now - usage.heartbeat > self.stale_after)

    def _state(self, name: str, record: NodeRecord, key: NodeKey, now: datetime) -> NodeState:
        memo = self._states.get(name)
        if memo is None or memo[0] != key:
            assert record.inventory is not None
            assignments = self.cache.assignments_on(name)
            state = build_node_state(
                record.inventory, record.usage, assignments, now, self.stale_after
            )
            memo = self._states[name] = (key, state)
        return memo[1]

    def node_state(self, name: str, now: datetime) -> NodeState | str:
        """The node's placement state, or why it has none (unknown, no inventory, bad data)."""
        ((record, version),) = self.cache.lookup([name])
        why = self._why_none(name, record)
        if why is not None:
            return why
        return self._state(name, record, self._key(record, version, now), now)

    def decide(
        self, names: list[str], request: PodGpuRequest, policy: Policy, now: datetime, score: bool
    ) -> list[Decision | str]:
        """Per node: the pod's fit and, when `score` and it fits, the raw score; or why not."""
        shape = self._shape_id((request, policy.name, self._generation, score))
        out: list[Decision | str] = []
        for name, (record, version) in zip(names, self.cache.lookup(names), strict=True):
            why = self._why_none(name, record)
            if why is not None:
                out.append(why)
                continue
            key = self._key(record, version, now)
            memo = self._decisions.get(name)
            if memo is None or memo[0] != key:
                memo = self._decisions[name] = (key, {})
            decision = memo[1].get(shape)
            if decision is None:
                decision = memo[1][shape] = self._decide(
                    self._state(name, record, key, now), request, policy, score
                )
            out.append(decision)
        return out

    @staticmethod
    def _decide(state: NodeState, request: PodGpuRequest, policy: Policy, score: bool) -> Decision:
        result = fit(request, state, policy)
        raw = None
        if score and result.fits and result.after is not None:
            raw = policy.raw_score(state, result.after, policy.workload)
        return (result, raw)

    def _shape_id(self, shape: tuple) -> int:
        """A small number per pod shape, hashed once per call instead of once per node."""
        found = self._shapes.get(shape)
        if found is None:
            if len(self._shapes) >= MAX_SHAPES:
                self._shapes.clear()
                self._decisions.clear()
            found = self._shapes[shape] = len(self._shapes)
        return found

    def observe(self, uid: str, request: PodGpuRequest) -> None:
        """Counts a pod once into the recent-request distribution that FGD scores against."""
        if uid in self._seen or not request.gpu_containers:
            return
        self._seen.append(uid)
        self._recent.append(request)
        self._unread += 1

    def workload(self) -> Workload:
        if self._unread and (self._unread >= WORKLOAD_REFRESH or len(self._recent) <= self._unread):
            self._workload = Workload.from_requests(self._recent)
            self._unread = 0
            self._generation += 1
        return self._workload
