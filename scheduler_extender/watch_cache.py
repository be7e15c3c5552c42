"""The extender's view of nodes and pods, fed by list+watch, so filter and score never call the API.

Everything the extender decides from is in annotations and DRA objects: a node's
inventory and usage, a pod's assignment; on a DRA node, InferGrid's ResourceSlices and
the allocated ResourceClaims (``claims.py``). The cache keeps them decoded and indexes
assignments and claim holdings by node, one ledger for both modes. Events are applied
by pure methods that take Kubernetes JSON, so tests need no cluster; ``start`` adds the
one I/O edge, four list+watch threads (``infergrid.reflector``).

A reservation is an assignment the extender has just written at bind, held until
the watch delivers the pod carrying it, so two binds in a row cannot both take
the same free memory. A tentative one (`hold`) is the placement prioritize
predicts kube-scheduler will bind: it takes its GPUs at once like any other,
until bind confirms it (`confirm`), or it runs out (`expire_tentative`), or the
watch shows its pod gone or bound without it.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from infergrid.assignment_annotation import PodAssignment
from infergrid.dra import DRIVER
from infergrid.dra_ledger import ClaimRecord, claim_record
from infergrid.dra_slices import DraDevice, slice_record
from infergrid.pod_request import PodGpuRequest
from infergrid.records import (
    LIVE_PODS,
    NodeRecord,
    PodRecord,
    is_live,
    node_record,
    pod_record,
    with_slices,
)
from infergrid.reflector import Reflector, Source
from scheduler_extender.claims import ClaimLedger

log = logging.getLogger(__name__)

ADDED: Final = "ADDED"
MODIFIED: Final = "MODIFIED"
DELETED: Final = "DELETED"
EVENT_TYPES: Final = (ADDED, MODIFIED, DELETED)

CHANGE_LOG: Final = 1024
"""Commits whose touched nodes ``changed_since`` remembers; a reader further behind rereads all."""
_UNTOUCHED: Final[frozenset[str]] = frozenset()
HTTP_NOT_FOUND: Final = 404
DISCOVERY_RETRY_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class _Reservation:
    namespace: str
    name: str
    assignment: PodAssignment
    made_at: int
    """The cache version right after it was made; a relist that began later has seen it."""
    until: float | None = None
    """When a tentative reservation runs out (monotonic seconds); None once bind holds it."""
    request: PodGpuRequest | None = None
    """What a tentative reservation was placed from: bind keeps it for the same request."""


@dataclass(frozen=True, slots=True)
class Tentative:
    """A tentative reservation as bind sees it: where, what, and from which request."""

    node: str
    assignment: PodAssignment
    request: PodGpuRequest


class ClusterCache:
    """Nodes and live pods, decoded, with every pod assignment indexed by its node.

    One RLock guards all state: watch threads write while HTTP handlers read.
    ``version`` grows with every change; ``node_version(name)`` moves only when
    that node's record or the assignments on it change, so a caller can cache
    per-node state and rebuild only what moved. ``changed_since`` names the
    nodes that moved after a version, so that caller need not even look the
    others up.
    """

    def __init__(self, resync_s: float = 300.0, watch_timeout_s: int = 10) -> None:
        self.resync_s = resync_s
        self.watch_timeout_s = watch_timeout_s
        self.version = 0
        self.reconnects = 0
        self._lock = threading.RLock()
        self._nodes: dict[str, NodeRecord] = {}
        """Each node's record, with its slices read (``with_slices``)."""
        self._plain: dict[str, NodeRecord] = {}
        """Each node's record from its annotations alone."""
        self._devices: dict[str, Mapping[str, DraDevice]] = {}
        """Per DRA node, its devices by name, as claim results name them."""
        self._dra = ClaimLedger()
        self._dra_nodes: frozenset[str] = frozenset()
        """The nodes whose GPUs come through DRA: only claim pods may go there."""
        self._pods: dict[str, PodRecord] = {}
        self._reservations: dict[str, _Reservation] = {}
        self._deadlines: list[tuple[float, str]] = []
        """A heap of (until, uid) per tentative reservation made; stale entries are skipped."""
        self._held: dict[str, PodAssignment] = {}
        self._on_node: dict[str, dict[str, PodAssignment]] = {}
        self._asks: dict[str, tuple[str, int, int]] = {}
        """Per live bound pod with CPU or memory requests: (node, millicores, MiB)."""
        self._requested: dict[str, tuple[int, int]] = {}
        """Per node, the CPU and memory its live pods request, as kube-scheduler counts."""
        self._node_versions: dict[str, int] = {}
        self._gpus_per_model: Counter[str] = Counter()
        self._gpu_nodes_cpu = 0
        """The GPUs of each model and the allocatable CPU of the GPU nodes, kept as nodes come
        and go: the learned workload reads them, and a sum over 5,000 nodes took 30 ms."""
        self._changes: deque[tuple[int, frozenset[str]]] = deque(maxlen=CHANGE_LOG)
        self._nodes_listed = threading.Event()
        self._pods_listed = threading.Event()
        self._slices_listed = threading.Event()
        self._claims_listed = threading.Event()

    # Events.

    def apply_node(self, event_type: str, node: dict[str, Any]) -> None:
        """One watch event of a Node."""
        _check_event(event_type)
        name = node["metadata"]["name"]
        record = None if event_type == DELETED else node_record(node)
        with self._lock:
            if self._plain.get(name) == record:
                return
            if record is None:
                del self._plain[name]
            else:
                self._plain[name] = record
            touched = self._reread({name})
            if touched:
                self._commit(touched)

    def apply_pod(self, event_type: str, pod: dict[str, Any]) -> None:
        """One watch event of a Pod; a deleted or finished pod frees its GPUs."""
        _check_event(event_type)
        record = None if event_type == DELETED else pod_record(pod)
        if record is not None and not is_live(record):
            record = None  # finished: it holds no GPU any more
        uid = pod["metadata"]["uid"]
        with self._lock:
            before = (self._pods.get(uid), self._reservations.get(uid))
            if record is None:
                self._pods.pop(uid, None)
            else:
                self._pods[uid] = record
            held = self._reservations.get(uid)
            if held is not None and _reservation_ends(record, held, None):
                del self._reservations[uid]
            if before != (self._pods.get(uid), self._reservations.get(uid)):
                self._commit(self._refresh(uid))

    def replace_all_nodes(self, nodes: list[dict[str, Any]]) -> None:
        """A relist: afterwards the nodes are exactly ``nodes``, as if added one by one."""
        records = {r.name: r for r in map(node_record, nodes)}
        with self._lock:
            names = self._plain.keys() | records.keys()
            moved = {n for n in names if self._plain.get(n) != records.get(n)}
            self._plain = records
            changed = self._reread(moved)
            if changed:
                self._commit(changed)
        self._nodes_listed.set()

    def apply_slice(self, event_type: str, obj: dict[str, Any]) -> None:
        """One watch event of a ResourceSlice of InferGrid's driver."""
        _check_event(event_type)
        record = None if event_type == DELETED else slice_record(obj)
        with self._lock:
            touched = self._reread(self._dra.put_slice(obj["metadata"]["name"], record))
            if touched:
                self._commit(touched)

    def replace_all_slices(self, slices: list[dict[str, Any]]) -> None:
        """A relist of the driver's ResourceSlices."""
        records = [slice_record(s) for s in slices]
        with self._lock:
            touched = self._reread(self._dra.replace_slices(records))
            if touched:
                self._commit(touched)
        self._slices_listed.set()

    def apply_claim(self, event_type: str, obj: dict[str, Any]) -> None:
        """One watch event of a ResourceClaim: an allocated one holds devices. A claim that
        holds nothing on a node (pending, another driver's) moves no version: filter reads
        it by name when its pod comes, and no node's state depends on it."""
        _check_event(event_type)
        record = None if event_type == DELETED else claim_record(obj)
        with self._lock:
            touched = self._recharge(self._dra.put_claim(obj["metadata"]["uid"], record))
            if touched:
                self._commit(touched)

    def replace_all_claims(self, claims: list[dict[str, Any]]) -> None:
        """A relist of every ResourceClaim."""
        records = [claim_record(c) for c in claims]
        with self._lock:
            touched = self._recharge(self._dra.replace_claims(records))
            if touched:
                self._commit(touched)
        self._claims_listed.set()

    def replace_all_pods(self, pods: list[dict[str, Any]], listed_at: int | None = None) -> None:
        """A relist: afterwards the pods are exactly the live ones of ``pods``.

        A reservation whose pod is missing from the list is dropped when it is
        older than the list (``listed_at``: ``version`` when the list began; None
        when the list is newer than every reservation), as its pod is gone; a
        younger one is kept, as the list may predate its pod's assignment.
        """
        records = {r.uid: r for r in map(pod_record, pods) if is_live(r)}
        with self._lock:
            before = (dict(self._pods), dict(self._reservations))
            uids = self._pods.keys() | records.keys() | self._reservations.keys()
            self._pods = records
            for uid, held in list(self._reservations.items()):
                if _reservation_ends(records.get(uid), held, listed_at):
                    del self._reservations[uid]
            touched = set().union(*(self._refresh(uid) for uid in uids))
            if before != (self._pods, self._reservations):
                self._commit(touched)
        self._pods_listed.set()

    # Reservations.

    def reserve(self, uid: str, namespace: str, name: str, assignment: PodAssignment) -> None:
        """Holds ``assignment`` until the pod event carrying it arrives.

        Reserve under the node's lock, before or right after writing the
        annotation: once the pod event with it has arrived, this does nothing.
        ``release`` when the write or the bind fails.
        """
        with self._lock:
            pod = self._pods.get(uid)
            if (pod is not None and pod.assignment is not None) or self._dra.charged(uid):
                return
            self._reservations[uid] = _Reservation(namespace, name, assignment, self.version + 1)
            self._commit(self._refresh(uid))

    def release(self, uid: str) -> None:
        """Drops a reservation, e.g. when bind failed; the pod record, if any, stays."""
        with self._lock:
            if self._reservations.pop(uid, None) is not None:
                self._commit(self._refresh(uid))

    def hold(
        self,
        uid: str,
        namespace: str,
        name: str,
        assignment: PodAssignment,
        request: PodGpuRequest,
        until: float,
    ) -> bool:
        """Holds ``assignment`` tentatively until ``until`` (or bind, or the watch ends it).

        Replaces an earlier tentative reservation of the pod; does nothing, and
        says so, where bind already holds the pod's GPUs, or the watch has shown
        the pod carrying them or bound: what it has is decided.
        """
        with self._lock:
            pod, held = self._pods.get(uid), self._reservations.get(uid)
            decided = pod is not None and (pod.assignment is not None or bool(pod.node_name))
            if decided or self._dra.charged(uid) or (held is not None and held.until is None):
                return False
            made = _Reservation(namespace, name, assignment, self.version + 1, until, request)
            self._reservations[uid] = made
            heapq.heappush(self._deadlines, (until, uid))
            self._commit(self._refresh(uid))
            return True

    def tentative(self, uid: str) -> Tentative | None:
        """The pod's tentative reservation, if one is held."""
        with self._lock:
            held = self._reservations.get(uid)
            if held is None or held.until is None or held.request is None:
                return None
            return Tentative(held.assignment.node, held.assignment, held.request)

    def confirm(self, uid: str) -> bool:
        """Bind takes the tentative reservation over: it no longer runs out. Whether one was
        held; the GPUs it holds do not move, so no node's version does either."""
        with self._lock:
            held = self._reservations.get(uid)
            if held is None or held.until is None:
                return False
            self._reservations[uid] = _Reservation(
                held.namespace, held.name, held.assignment, held.made_at
            )
            return True

    def release_tentative(self, uid: str) -> bool:
        """Drops the pod's tentative reservation, never one bind holds; whether one went."""
        with self._lock:
            held = self._reservations.get(uid)
            if held is None or held.until is None:
                return False
            self.release(uid)
            return True

    def expire_tentative(self, now: float) -> list[str]:
        """Drops every tentative reservation whose time ran out by ``now``; their uids."""
        with self._lock:
            gone: list[str] = []
            while self._deadlines and is_due(self._deadlines[0][0], now):
                until, uid = heapq.heappop(self._deadlines)
                held = self._reservations.get(uid)
                if held is not None and held.until == until:
                    self.release(uid)
                    gone.append(uid)
            return gone

    # Queries.

    def node(self, name: str) -> NodeRecord | None:
        with self._lock:
            return self._nodes.get(name)

    def nodes(self) -> dict[str, NodeRecord]:
        with self._lock:
            return dict(self._nodes)

    def pod(self, uid: str) -> PodRecord | None:
        with self._lock:
            return self._pods.get(uid)

    def dra_nodes(self) -> frozenset[str]:
        """The nodes that offer their GPUs through DRA (their slices), problem ones too."""
        return self._dra_nodes

    def claim(self, namespace: str, name: str) -> ClaimRecord | None:
        """A ResourceClaim by its namespace and name."""
        with self._lock:
            return self._dra.claim(namespace, name)

    def gpu_totals(self) -> tuple[dict[str, int], int]:
        """GPUs of each model, and allocatable CPU millicores in all, over the nodes that
        have GPUs."""
        with self._lock:
            models = {m: n for m, n in self._gpus_per_model.items() if n > 0}
            return models, self._gpu_nodes_cpu

    def reserved(self, uid: str) -> bool:
        """Whether a bind's reservation for ``uid`` is held (its pod event not yet seen); a
        tentative one is not a bind's."""
        with self._lock:
            held = self._reservations.get(uid)
            return held is not None and held.until is None

    def requested_on(self, node: str) -> tuple[int, int]:
        """The CPU (millicores) and memory (MiB) the live pods bound to ``node`` request."""
        with self._lock:
            return self._requested.get(node, (0, 0))

    def assignments_on(self, node: str) -> list[PodAssignment]:
        """Every assignment on ``node``, reservations and claim holdings included, oldest
        first (claims first: they count as made at the epoch)."""
        with self._lock:
            held = self._holdings(node)
            return [a for _, a in sorted(held, key=lambda h: (h[1].assigned_at, h[0]))]

    def holders_on(self, node: str) -> list[tuple[str, PodRecord | None, PodAssignment]]:
        """(uid, pod, assignment) of every GPU holder on ``node``; the pod is None for a
        bind's reservation whose pod event has not come yet, and for a claim charged to
        itself (neither is ever a victim)."""
        with self._lock:
            held = sorted(self._holdings(node), key=lambda h: h[0])
            return [(uid, self._pods.get(uid), assignment) for uid, assignment in held]

    def _holdings(self, node: str) -> list[tuple[str, PodAssignment]]:
        return [*self._on_node.get(node, {}).items(), *self._dra.held_on(node).items()]

    def lookup(self, names: list[str]) -> list[tuple[NodeRecord | None, int]]:
        """Each node's record and version under one lock: filter reads thousands at once."""
        with self._lock:
            return [(self._nodes.get(n), self._node_versions.get(n, 0)) for n in names]

    def node_version(self, name: str) -> int:
        """The ``version`` of the last change to ``name``; 0 once it has neither record nor pods."""
        with self._lock:
            return self._node_versions.get(name, 0)

    def changed_since(self, version: int) -> frozenset[str] | None:
        """Every node whose record or assignments changed after ``version``, gone ones
        included; None when the log no longer reaches back that far: reread them all."""
        with self._lock:
            if version >= self.version:
                return _UNTOUCHED
            if self._changes[0][0] > version + 1:  # every commit is logged: never empty here
                return None
            moved: set[str] = set()
            for stamp, touched in reversed(self._changes):
                if stamp <= version:
                    break
                moved |= touched
            return frozenset(moved)

    def size(self) -> dict[str, int]:
        with self._lock:
            return {
                "nodes": len(self._nodes),
                "pods": len(self._pods),
                "assigned_pods": sum(1 for p in self._pods.values() if p.assignment is not None),
                "reservations": len(self._reservations),
            } | self._dra.size()

    def _listed(self) -> tuple[threading.Event, ...]:
        return self._nodes_listed, self._pods_listed, self._slices_listed, self._claims_listed

    def synced(self) -> bool:
        """Every kind has been listed once, so an empty answer means empty, not unknown."""
        return all(listed.is_set() for listed in self._listed())

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for listed in self._listed():
            if not listed.wait(max(0.0, deadline - time.monotonic())):
                return False
        return True

    # Index upkeep.

    def _reread(self, names: set[str]) -> set[str]:
        """Merges each named node's annotations with its slices again, and what claims hold
        there; returns the nodes whose record or holdings changed."""
        touched = set()
        for name in names:
            plain = self._plain.get(name)
            record, devices = None, {}
            if plain is not None:
                record, devices = with_slices(plain, self._dra.slices_of(name))
            before = self._nodes.get(name)
            if devices:
                self._devices[name] = devices
            else:
                self._devices.pop(name, None)
            if before != record:
                self._count(before, -1)
                self._count(record, 1)
                if record is None:
                    del self._nodes[name]
                else:
                    self._nodes[name] = record
                touched.add(name)
                if (record is not None and record.dra) != (name in self._dra_nodes):
                    self._dra_nodes = self._dra_nodes ^ {name}
        return touched | self._recharge(names)

    def _recharge(self, names: set[str]) -> set[str]:
        """Works out again what allocated claims hold on each named node; a pod they now
        hold devices for needs no reservation any more. The nodes whose holdings changed."""
        touched = set()
        for name in names:
            changed, charged = self._dra.recharge(name, self._devices.get(name, {}))
            if changed:
                touched.add(name)
            for uid in charged & self._reservations.keys():
                del self._reservations[uid]
                touched |= self._refresh(uid)
        return touched

    def _refresh(self, uid: str) -> set[str]:
        """Re-indexes what ``uid`` holds: its pod's assignment, else its reservation, and
        its pod's CPU and memory requests on its node.

        Returns the nodes whose assignments or requests changed.
        """
        return self._refresh_asks(uid) | self._refresh_held(uid)

    def _refresh_asks(self, uid: str) -> set[str]:
        pod = self._pods.get(uid)
        new = None
        if pod is not None and pod.node_name and (pod.cpu_milli or pod.memory_mib):
            new = (pod.node_name, pod.cpu_milli, pod.memory_mib)
        old = self._asks.get(uid)
        if old == new:
            return set()
        for ask, sign in ((old, -1), (new, 1)):
            if ask is None:
                continue
            node, cpu, memory = ask
            had_cpu, had_memory = self._requested.get(node, (0, 0))
            now = (had_cpu + sign * cpu, had_memory + sign * memory)
            if now == (0, 0):
                self._requested.pop(node, None)
            else:
                self._requested[node] = now
        if new is None:
            del self._asks[uid]
        else:
            self._asks[uid] = new
        return {ask[0] for ask in (old, new) if ask is not None}

    def _refresh_held(self, uid: str) -> set[str]:
        old = self._held.get(uid)
        pod, reservation = self._pods.get(uid), self._reservations.get(uid)
        new = pod.assignment if pod is not None else None
        if new is None and reservation is not None:
            new = reservation.assignment
        if old == new:
            return set()
        if old is not None:
            self._unindex(uid, old.node)
        if new is not None:
            self._held[uid] = new
            self._on_node.setdefault(new.node, {})[uid] = new
        return {a.node for a in (old, new) if a is not None}

    def _unindex(self, uid: str, node: str) -> None:
        del self._held[uid]
        on_node = self._on_node[node]
        del on_node[uid]
        if not on_node:
            del self._on_node[node]

    def _count(self, record: NodeRecord | None, sign: int) -> None:
        """Adds (1) or takes away (-1) a node's part of ``gpu_totals``."""
        if record is None or record.inventory is None or not record.inventory.gpus:
            return
        self._gpu_nodes_cpu += sign * record.cpu_milli
        for gpu in record.inventory.gpus:
            self._gpus_per_model[gpu.model] += sign

    def _commit(self, touched: set[str]) -> None:
        """Counts one change, stamps the nodes it touched and logs them, even none, so the
        log's first entry tells how far back it is complete."""
        self.version += 1
        self._changes.append((self.version, frozenset(touched) if touched else _UNTOUCHED))
        for name in touched:
            if name in self._nodes or name in self._on_node or self._dra.has_holdings(name):
                self._node_versions[name] = self.version
            else:
                self._node_versions.pop(name, None)

    # The I/O edge.

    def start(self, api: client.ApiClient, stop: threading.Event) -> None:
        """Starts the node, pod, slice and claim list+watch threads; they end soon after
        ``stop`` is set. On an API server without ``resource.k8s.io/v1`` (before 1.34) there
        are no slices or claims: those two count as listed, and empty."""
        core = client.CoreV1Api(api)
        sources = [
            Source(
                "nodes",
                core.list_node,
                {},
                lambda nodes, _listed_at: self.replace_all_nodes(nodes),
                self.apply_node,
            ),
            Source(
                "pods",
                core.list_pod_for_all_namespaces,
                {"field_selector": LIVE_PODS},
                self.replace_all_pods,
                self.apply_pod,
                mark=lambda: self.version,
            ),
        ]
        if serves_dra(api, stop):
            resource = client.ResourceV1Api(api)
            sources += [
                Source(
                    "resourceslices",
                    resource.list_resource_slice,
                    {"field_selector": f"spec.driver={DRIVER}"},
                    lambda slices, _listed_at: self.replace_all_slices(slices),
                    self.apply_slice,
                ),
                Source(
                    "resourceclaims",
                    resource.list_resource_claim_for_all_namespaces,
                    {},
                    lambda claims, _listed_at: self.replace_all_claims(claims),
                    self.apply_claim,
                ),
            ]
        else:
            log.warning("the API server serves no resource.k8s.io/v1: DRA nodes are not read")
            self.replace_all_slices([])
            self.replace_all_claims([])
        reflector = Reflector(self.resync_s, self.watch_timeout_s, self._reconnected)
        reflector.start(sources, stop)

    def _reconnected(self) -> None:
        with self._lock:
            self.reconnects += 1


def serves_dra(api: client.ApiClient, stop: threading.Event) -> bool:
    """Whether the API server serves ``resource.k8s.io/v1``; asked until it answers (or ``stop``
    is set), since the extender cannot read DRA nodes right without knowing."""
    while not stop.is_set():
        try:
            client.ResourceV1Api(api).get_api_resources(_request_timeout=10)
            return True
        except ApiException as err:
            if err.status == HTTP_NOT_FOUND:
                return False
            log.warning("asking whether resource.k8s.io/v1 is served failed: %s", err.reason)
        except (HTTPError, OSError) as err:
            log.warning("asking whether resource.k8s.io/v1 is served failed: %s", err)
        stop.wait(DISCOVERY_RETRY_S)
    return False


def _check_event(event_type: str) -> None:
    if event_type not in EVENT_TYPES:
        raise ValueError(f"event type {event_type!r} is not one of {', '.join(EVENT_TYPES)}")


def is_due(until: float, now: float) -> bool:
    """A tentative reservation runs out at its deadline, not after it."""
    return until <= now


def _reservation_ends(pod: PodRecord | None, held: _Reservation, listed_at: int | None) -> bool:
    """The pod (seen live, or None where it is gone or finished) carries its assignment; a
    tentative reservation also ends once its pod is bound, as that was not this extender's
    bind (which confirms first). A pod missing from a relist is gone when the reservation is
    older than the list (``listed_at``; None for a watch event or a list newer than all)."""
    if pod is not None:
        return pod.assignment is not None or (held.until is not None and bool(pod.node_name))
    return listed_at is None or held.made_at <= listed_at
