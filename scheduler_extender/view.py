"""Placement state per node, kept current from the watch cache in the core's node set.

A node's NodeState depends on its annotations, the assignments on it and
whether its heartbeat is stale; the cache's per-node version plus the
staleness bit key it, so a filter over thousands of nodes rebuilds only the
few that moved since the last call. Which nodes are current is checked with
arrays: the cache's global version says whether anything moved since a row
was last checked, its change log which nodes did, and each row's heartbeat
whether its staleness flipped, so a call after one bind looks up one node, not
thousands, and one in which nothing moved none.

A re-read of the learned workload changes every node's fgd score. The view adopts it only
after ``adoption`` has scored the shapes of the pods prioritize saw last under it, a slice of
nodes per step, which the app runs between requests: the pods keep the scores of the
workload in use until then, and the first pod after the adoption finds its scores kept.

A node's state carries its CPU and memory (``host``): allocatable from the node, and
what its live pods request, as kube-scheduler counts them; fgd and fgd-cluster-aware
read it. This module only keeps the node set current and says why a node has no state;
every decision is the placement core's ``NodeSet``'s (``decisions.py`` asks it).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from itertools import compress
from operator import itemgetter
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from infergrid.dra import RESOURCE_GPU_CLAIM
from infergrid.dra_ledger import pod_claim_containers
from infergrid.placement import (
    HostRequest,
    HostResources,
    LearnedWorkload,
    NodeSet,
    NodeState,
    Verdicts,
    Workload,
    build_node_state,
    resolve_policy,
)
from infergrid.pod_request import PodGpuRequest, parse_pod_request
from infergrid.records import NodeRecord
from scheduler_extender.watch_cache import ClusterCache

ASKED_LISTS: Final = 2
"""Name lists whose index rows are remembered: filter's (all nodes) and those it passed."""
LOOKUP_CHUNK: Final = 512
"""Nodes read from the cache per lock: few enough that their records die young."""
ADOPTION_SHAPES: Final = 16
"""Pod shapes, the last prioritize scored, that a new workload is scored for before it is
adopted; fewer than the node set keeps scores of (``MAX_SCORED_SHAPES``)."""
ADOPTION_ROWS: Final = 256
"""Nodes scored per step of an adoption: about a millisecond at fgd-cluster-aware, the most
a request that arrives meanwhile waits."""

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)
_NO_HEARTBEAT: Final = -(1 << 62)
"""A node without usage is stale at any time: ``now - this`` exceeds any ``stale_after``."""
_LONGEST_STALE: Final = (1 << 62) - 1
"""``stale_after`` in µs is capped here so the arithmetic stays in int64; no real one is near."""

NodeKey = tuple[str, int, bool]
"""A node's key in the node set: its name, cache version and staleness."""
Rows = npt.NDArray[np.int64]


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
    """The extender's node set, kept current from the watch cache, and its learned workload."""

    def __init__(self, cache: ClusterCache, stale_after: timedelta):
        self.cache = cache
        self.stale_after = stale_after
        self.nodes = NodeSet()
        self._stale_us = min(stale_after // _MICROSECOND, _LONGEST_STALE)
        self._stamps = _Stamps()
        self._stamps.fit_rows(1)
        self._asked: deque[tuple[list[str], Rows]] = deque(maxlen=ASKED_LISTS)
        self._learned = LearnedWorkload(cache.gpu_totals, defer=True)
        self.prepared = False
        """Whether ``prepare`` built every node's state: the extender is ready only then."""
        self._shapes: OrderedDict[tuple[PodGpuRequest, HostRequest | None], None] = OrderedDict()

    def request_of(self, pod: dict[str, Any], default_policy: str) -> PodGpuRequest:
        """The pod's GPU request; a pod whose GPUs come by claim is read from its claims in
        the cache (``ClaimMissing`` while one is not there yet)."""
        claims = partial(pod_claim_containers, lookup=self.cache.claim)
        return parse_pod_request(pod, default_policy, claims)

    def wrong_mode(self, request: PodGpuRequest, name: str) -> str | None:
        """Why ``name`` never takes the pod for the way it gets its GPUs (by claim, or from
        the device plugin); None where it may. A pod without GPUs goes anywhere."""
        dra = name in self.cache.dra_nodes()
        if request.by_claim and not dra:
            return (f"node {name} offers its GPUs through the device plugin; this pod asks "
                    "for them by ResourceClaim")  # fmt: skip
        if dra and not request.by_claim and request.gpu_containers:
            return (f"node {name} offers its GPUs through DRA; this pod asks the device "
                    f"plugin (ask {RESOURCE_GPU_CLAIM} and a ResourceClaim instead)")  # fmt: skip
        return None

    def _why_none(self, name: str, record: NodeRecord | None) -> str | None:
        if record is None:
            return f"node {name} is not in the extender's cache"
        if record.problem:
            return f"node {name} has an unreadable GPU annotation: {record.problem}"
        if record.inventory is None:
            return (f"node {name} publishes no GPU inventory (is the device plugin or the "
                    "DRA driver running?)")  # fmt: skip
        return None

    def _key(self, record: NodeRecord, version: int, now: datetime) -> NodeKey:
        usage = record.usage
        return (record.name, version, usage is None or now - usage.heartbeat > self.stale_after)

    def _state(self, record: NodeRecord, key: NodeKey, now: datetime) -> tuple[NodeState, int]:
        """The node's state for ``key`` (rebuilt only when the key moved) and its index row."""
        held = self.nodes.get(record.name)
        if held is not None and held[0] == key:
            return held[1], self.nodes.row_of(record.name)
        assert record.inventory is not None
        assignments = self.cache.assignments_on(record.name)
        state = build_node_state(record.inventory, record.usage, assignments, now, self.stale_after)
        if record.cpu_milli:
            cpu, memory = self.cache.requested_on(record.name)
            state = replace(
                state, host=HostResources(record.cpu_milli, record.memory_mib, cpu, memory)
            )
        return state, self.nodes.put(state, key)

    def node_state(self, name: str, now: datetime) -> NodeState | str:
        """The node's placement state, or why it has none (unknown, no inventory, bad data)."""
        ((record, version),) = self.cache.lookup([name])
        why = self._why_none(name, record)
        if why is not None:
            return why
        assert record is not None
        return self._state(record, self._key(record, version, now), now)[0]

    def current(self, names: list[str], now: datetime) -> tuple[Rows, dict[int, str]]:
        """Brings the named nodes up to date in ``nodes``: the index row of each (-1 where
        none), and by position why a node has no state at all."""
        return self._sync(names, now)

    def prepare(self, now: datetime) -> int:
        """Builds the state of every node in the cache, as a first filter over them all
        would, and says the view is ``prepared``: how many nodes it holds."""
        names = sorted(self.cache.nodes())
        self.current(names, now)
        self.prepared = True
        return len(names)

    def remember(self, verdicts: Verdicts, asked: int) -> None:
        """Keeps the rows of the nodes that passed a filter of ``asked`` nodes: prioritize
        is asked about those next."""
        if len(verdicts.passed) < asked:
            self._asked.append((list(verdicts.passed), verdicts.passed_rows.copy()))

    def observe(self, uid: str, request: PodGpuRequest, host: HostRequest | None) -> None:
        """Counts a pod once into the recent-request distribution that fgd scores against,
        with its CPU and GPU models (``host``) where they read."""
        self._learned.observe(uid, request, host)

    def workload(self) -> Workload:
        """The learned workload, with the GPUs of each model in the cache's node list."""
        return self._learned.workload()

    def scored(self, request: PodGpuRequest, host: HostRequest | None) -> None:
        """Notes a pod shape prioritize scored: an adoption scores the last few first."""
        shape = (request, host)
        self._shapes.pop(shape, None)
        self._shapes[shape] = None
        if len(self._shapes) > ADOPTION_SHAPES:
            self._shapes.popitem(last=False)

    def adoption(self) -> Iterator[None] | None:
        """The steps that adopt a pending workload, or None where none is pending: each
        scores up to ``ADOPTION_ROWS`` nodes for one recent shape under it; after the last,
        it is adopted, unless a newer re-read replaced it meanwhile (its own adoption then
        follows). Rows rewritten during the steps are scored again when next asked."""
        pending = self._learned.pending
        return None if pending is None else self._adopt(pending)

    def _adopt(self, pending: Workload) -> Iterator[None]:
        rows = self.nodes.held_rows()  # a node written or added later is scored when asked
        for request, host in list(self._shapes):
            policy = resolve_policy(request.policy, pending)
            for start in range(0, len(rows), ADOPTION_ROWS):
                self.nodes.warm(rows[start : start + ADOPTION_ROWS], request, policy, host)
                yield
                if self._learned.pending is not pending:
                    return
        self._learned.adopt(pending)

    def _sync(self, names: list[str], now: datetime) -> tuple[Rows, dict[int, str]]:
        """The index row of each name, written from the node's current state (-1 where it
        has none), and by position why a node has no state.

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
        missing: dict[int, str] = {}
        if not recheck.any():
            if not remembered:
                self._asked.append((list(names), rows.copy()))
            return rows, missing
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
                    missing[position] = found
        current = rows[todo]
        stamps.checked[current[current >= 0]] = version
        if not np.array_equal(rows, before):
            self._asked.clear()  # a node gained or lost its row: other lists may name it
            remembered = False
        if not remembered:
            self._asked.append((list(names), rows.copy()))
        return rows, missing

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
        changed_rows = self.nodes.rows(tuple(changed))
        flagged[changed_rows[changed_rows >= 0]] = True
        moved = behind & flagged[at]
        checked[at[behind & ~moved]] = version
        return moved

    def _rows(self, names: list[str]) -> tuple[Rows, list[str] | None]:
        """The index row of each name (-1 where none), and the equal list remembered, if any.

        kube-scheduler asks filter about all nodes and prioritize about those
        that passed, pod after pod, so filter's list and the one it passed are
        kept with their rows: comparing a list is cheaper than hashing each name.
        """
        for at, (known, rows) in enumerate(self._asked):
            if known == names:
                self._asked.rotate(-at - 1)  # most recent last: the next append evicts the other
                return rows.copy(), known
        return self.nodes.rows(names), None

    def _rewrite(
        self, name: str, record: NodeRecord | None, version: int, now: datetime
    ) -> int | str:
        """Brings the node's state up to date: its index row (-1: none), or why it has no
        state."""
        why = self._why_none(name, record)
        if why is not None:
            self.nodes.discard(name)
            return why
        assert record is not None
        key = self._key(record, version, now)
        row = self._state(record, key, now)[1]
        if row < 0:
            return row
        stamps = self._stamps
        stamps.fit_rows(row + 1)
        stamps.version[row], stamps.stale[row] = version, key[2]
        stamps.heartbeat[row] = _micros(record)
        return row


def _micros(record: NodeRecord) -> int:
    """The node's heartbeat in µs since the epoch, exact; ``_NO_HEARTBEAT`` without usage."""
    usage = record.usage
    return _NO_HEARTBEAT if usage is None else (usage.heartbeat - _EPOCH) // _MICROSECOND
