"""Placement state per node, derived from the watch cache, kept in the core's offer index.

A node's NodeState depends on its annotations, the assignments on it and
whether its heartbeat is stale; the cache's per-node version plus the
staleness bit key it, so a filter over thousands of nodes rebuilds only the
few that moved since the last call. Each state is also written into the
placement core's `OfferIndex`, whose row answers, for the common pods (one
container asking for a share or for whole GPUs), fit, binpack and spread raw
scores and the rejection reason for every node at once. Which rows are current
is checked with arrays too: the cache's global version says whether anything
moved since a row was last checked, its change log which nodes did, and each
row's heartbeat whether its staleness flipped, so a call after one bind looks
up one node, not thousands, and one in which nothing moved none.

What the index does not answer (MIG, pods with several GPU containers, fgd's
scores, nodes it cannot hold) goes node by node through `fit` and the policy's
scorer, memoised under the node's key and the pod's shape like
kube-scheduler's old equivalence cache. The decisions themselves are the
placement core's, never re-implemented here.
"""

from __future__ import annotations

from collections import deque
from datetime import UTC, datetime, timedelta
from itertools import compress
from operator import itemgetter
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from infergrid.placement import (
    FitResult,
    NodeState,
    OfferIndex,
    Policy,
    Workload,
    build_node_state,
    fit,
)
from infergrid.pod_request import PodGpuRequest
from infergrid.records import NodeRecord
from scheduler_extender.watch_cache import ClusterCache

WORKLOAD_WINDOW: Final = 1000
WORKLOAD_REFRESH: Final = 50
"""FGD's request distribution is re-read after this many new pods, not after each one."""
MAX_SHAPES: Final = 4096
ASKED_LISTS: Final = 2
"""Name lists whose index rows are remembered: filter's (all nodes) and those it passed."""
LOOKUP_CHUNK: Final = 512
"""Nodes read from the cache per lock: few enough that their records die young."""

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)
_NO_HEARTBEAT: Final = -(1 << 62)
"""A node without usage is stale at any time: ``now - this`` exceeds any ``stale_after``."""
_LONGEST_STALE: Final = (1 << 62) - 1
"""``stale_after`` in µs is capped here so the arithmetic stays in int64; no real one is near."""

Decision = tuple[FitResult, float | None]
NodeKey = tuple[int, bool]
Unindexed = str | tuple[NodeKey, NodeState]
"""A node without an index row: why it has no state, or its key and state for `fit`."""


class Verdicts(NamedTuple):
    """Filter's answer: nodes passed (in the order asked), failed and unresolvable with
    their reasons, and the resource (or why none) behind each rejection, for metrics."""

    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    categories: list[str]


class _Stamps:
    """Per index row: the node version and staleness it was written for, its heartbeat in
    µs since the epoch, and the cache version at which it was last found current."""

    def __init__(self) -> None:
        self.version = np.zeros(0, dtype=np.int64)
        self.stale = np.zeros(0, dtype=np.bool_)
        self.heartbeat = np.zeros(0, dtype=np.int64)
        self.checked = np.full(0, -1, dtype=np.int64)

    def fit_rows(self, rows: int) -> None:
        if rows <= len(self.version):
            return
        size = max(rows, 2 * len(self.version), 64)
        for name, fill in (("version", 0), ("stale", False), ("heartbeat", 0), ("checked", -1)):
            old = getattr(self, name)
            new = np.full(size, fill, dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)


class PlacementView:
    def __init__(self, cache: ClusterCache, stale_after: timedelta):
        self.cache = cache
        self.stale_after = stale_after
        self._stale_us = min(stale_after // _MICROSECOND, _LONGEST_STALE)
        self._states: dict[str, tuple[NodeKey, NodeState]] = {}
        self._decisions: dict[str, tuple[NodeKey, dict[int, Decision]]] = {}
        self._shapes: dict[tuple, int] = {}
        self._index = OfferIndex()
        self._stamps = _Stamps()
        self._stamps.fit_rows(1)
        self._asked: deque[tuple[list[str], npt.NDArray[np.int64]]] = deque(maxlen=ASKED_LISTS)
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

    # Many nodes at once.

    def filter(
        self, names: list[str], request: PodGpuRequest, policy: Policy, now: datetime
    ) -> Verdicts:
        """Which nodes the pod fits, and why each other one does not."""
        if not self._index.answers(request):
            return self._filter_each(names, request, policy, now)
        rows, unindexed = self._sync(names, now)
        held = np.flatnonzero(rows >= 0)
        fits = self._index.fits(rows[held], request)
        assert fits is not None
        out = Verdicts([], {}, {}, [])
        passed = np.zeros(len(names), dtype=np.bool_)
        passed[held[fits]] = True
        rejected = held[~fits]
        if len(rejected):
            why = self._index.why_not(rows[rejected], request, policy)
            failed = compress(names, _mask(len(names), rejected))
            out.failed.update(zip(failed, why.reasons, strict=True))
            out.categories.extend(why.resources)
        if unindexed:
            self._filter_unindexed(names, unindexed, passed, out, request, policy)
        out.passed.extend(compress(names, passed.tolist()))
        if len(out.passed) < len(names):  # prioritize is asked about these next
            self._asked.append((list(out.passed), rows[passed]))
        return out

    def _filter_unindexed(
        self,
        names: list[str],
        unindexed: dict[int, Unindexed],
        passed: npt.NDArray[np.bool_],
        out: Verdicts,
        request: PodGpuRequest,
        policy: Policy,
    ) -> None:
        """Nodes without an index row: why they have no state, or `fit`, memoised."""
        shape = self._shape_id((request, policy.name, self._generation, False))
        for at, node in unindexed.items():
            if isinstance(node, str):
                out.unresolvable[names[at]] = node
                out.categories.append("no-inventory")
                continue
            result = self._memoised(names[at], *node, shape, request, policy, False)[0]
            passed[at] = result.fits
            if not result.fits:
                out.failed[names[at]] = "; ".join(result.reasons)
                out.categories.extend(s.resource for s in result.shortfalls)

    def raw_scores(
        self, names: list[str], request: PodGpuRequest, policy: Policy, now: datetime
    ) -> npt.NDArray[np.float64]:
        """The raw score of the pod on each node, in the order given; NaN where it does not
        fit or the node has no state."""
        if not self._index.scores(request, policy):
            return self._raw_scores_each(names, request, policy, now)
        rows, unindexed = self._sync(names, now)
        held = np.flatnonzero(rows >= 0)
        scored = self._index.raw_scores(rows[held], request, policy)
        assert scored is not None
        raw = np.full(len(names), np.nan)
        raw[held] = scored
        if unindexed:
            shape = self._shape_id((request, policy.name, self._generation, True))
            for at, node in unindexed.items():
                if not isinstance(node, str):
                    found = self._memoised(names[at], *node, shape, request, policy, True)[1]
                    raw[at] = np.nan if found is None else found
        return raw

    def _sync(
        self, names: list[str], now: datetime
    ) -> tuple[npt.NDArray[np.int64], dict[int, Unindexed]]:
        """The index row of each name, written from the node's current state; -1, with the
        node (or why there is none) in the returned dict by position, where it has no row.

        Only rows whose node the cache says moved since they were last checked,
        or whose staleness flipped since written, are looked up; only those
        whose version or staleness moved are rebuilt and rewritten.
        """
        version = self.cache.version
        rows, known = self._rows(names)
        remembered = known is not None
        stamps = self._stamps
        held = rows >= 0
        at = np.where(held, rows, 0)
        now_us = (now - _EPOCH) // _MICROSECOND
        stale = now_us - stamps.heartbeat[at] > self._stale_us
        recheck = ~held | self._moved(at, held, version) | (stale != stamps.stale[at])
        unindexed: dict[int, Unindexed] = {}
        if not recheck.any():
            if not remembered:
                self._asked.append((list(names), rows.copy()))
            return rows, unindexed
        before = rows.copy()
        todo = np.flatnonzero(recheck)
        # A remembered list's strings have their hashes cached: cheaper keys for the cache.
        todo_names = list(compress(known or names, recheck.tolist()))
        for start in range(0, len(todo), LOOKUP_CHUNK):
            # In chunks, so the (record, version) pairs die young and never reach the
            # collector's oldest generation, whose full scans would stall a later call.
            part = slice(start, start + LOOKUP_CHUNK)
            looked = self.cache.lookup(todo_names[part])
            versions = np.fromiter(map(itemgetter(1), looked), dtype=np.int64, count=len(looked))
            sub = todo[part]
            moved = ~held[sub] | (stamps.version[at[sub]] != versions)
            moved |= stale[sub] != stamps.stale[at[sub]]
            for j in np.flatnonzero(moved).tolist():
                record, node_version = looked[j]
                position = int(sub[j])
                found = self._rewrite(names[position], record, node_version, now)
                if isinstance(found, int):
                    rows[position] = found
                else:
                    rows[position] = -1
                    unindexed[position] = found
        current = rows[todo]
        stamps.checked[current[current >= 0]] = version
        if not np.array_equal(rows, before):
            self._asked.clear()  # a node gained or lost its row: other lists may name it
            remembered = False
        if not remembered:
            self._asked.append((list(names), rows.copy()))
        return rows, unindexed

    def _moved(
        self, at: npt.NDArray[np.int64], held: npt.NDArray[np.bool_], version: int
    ) -> npt.NDArray[np.bool_]:
        """Which held rows may be out of date: checked before ``version`` and named by the
        cache's change log since then (all checked before it, when the log does not reach).

        Rows the log clears are stamped checked at ``version`` here, so the next call
        reads the log only from there; one bind between calls costs a lookup or two, not
        one per node.
        """
        checked = self._stamps.checked
        behind = held & (checked[at] != version)
        if not behind.any():
            return behind
        changed = self.cache.changed_since(int(checked[at[behind]].min()))
        if changed is None:
            return behind
        flagged = np.zeros(len(checked), dtype=np.bool_)
        changed_rows = self._index.rows(tuple(changed))
        flagged[changed_rows[changed_rows >= 0]] = True
        moved = behind & flagged[at]
        checked[at[behind & ~moved]] = version
        return moved

    def _rows(self, names: list[str]) -> tuple[npt.NDArray[np.int64], list[str] | None]:
        """The index row of each name (-1 where none), and the equal list remembered, if any.

        kube-scheduler asks filter about all nodes and prioritize about those
        that passed, pod after pod, so filter's list and the one it passed are
        kept with their rows: comparing a list is cheaper than hashing each name.
        """
        for at, (known, rows) in enumerate(self._asked):
            if known == names:
                self._asked.rotate(-at - 1)  # most recent last: the next append evicts the other
                return rows.copy(), known
        return self._index.rows(names), None

    def _rewrite(
        self, name: str, record: NodeRecord | None, version: int, now: datetime
    ) -> int | Unindexed:
        """Rebuilds the node's state and index row: the row, or the node as it has none."""
        why = self._why_none(name, record)
        if why is not None:
            self._index.discard(name)
            return why
        assert record is not None
        key = self._key(record, version, now)
        state = self._state(name, record, key, now)
        if not self._index.update(state):
            return (key, state)
        row = int(self._index.rows([name])[0])
        stamps = self._stamps
        stamps.fit_rows(row + 1)
        stamps.version[row], stamps.stale[row] = version, key[1]
        stamps.heartbeat[row] = _micros(record)
        return row

    # Node by node, through fit.

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
            assert record is not None
            key = self._key(record, version, now)
            state = self._state(name, record, key, now)
            out.append(self._memoised(name, key, state, shape, request, policy, score))
        return out

    def _filter_each(
        self, names: list[str], request: PodGpuRequest, policy: Policy, now: datetime
    ) -> Verdicts:
        out = Verdicts([], {}, {}, [])
        for name, decision in zip(
            names, self.decide(names, request, policy, now, False), strict=True
        ):
            if isinstance(decision, str):
                out.unresolvable[name] = decision
                out.categories.append("no-inventory")
            elif decision[0].fits:
                out.passed.append(name)
            else:
                out.failed[name] = "; ".join(decision[0].reasons)
                out.categories.extend(s.resource for s in decision[0].shortfalls)
        return out

    def _raw_scores_each(
        self, names: list[str], request: PodGpuRequest, policy: Policy, now: datetime
    ) -> npt.NDArray[np.float64]:
        raw = np.full(len(names), np.nan)
        for at, decision in enumerate(self.decide(names, request, policy, now, True)):
            if not isinstance(decision, str) and decision[1] is not None:
                raw[at] = decision[1]
        return raw

    def _memoised(
        self,
        name: str,
        key: NodeKey,
        state: NodeState,
        shape: int,
        request: PodGpuRequest,
        policy: Policy,
        score: bool,
    ) -> Decision:
        memo = self._decisions.get(name)
        if memo is None or memo[0] != key:
            memo = self._decisions[name] = (key, {})
        decision = memo[1].get(shape)
        if decision is None:
            decision = memo[1][shape] = self._decide(state, request, policy, score)
        return decision

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


def _micros(record: NodeRecord) -> int:
    """The node's heartbeat in µs since the epoch, exact; ``_NO_HEARTBEAT`` without usage."""
    usage = record.usage
    return _NO_HEARTBEAT if usage is None else (usage.heartbeat - _EPOCH) // _MICROSECOND


def _mask(size: int, positions: npt.NDArray[np.intp]) -> list[bool]:
    """``size`` flags, true at ``positions``: for ``compress``, which walks them in C."""
    flags = np.zeros(size, dtype=np.bool_)
    flags[positions] = True
    return flags.tolist()
