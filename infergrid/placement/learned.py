"""The workload fgd and fgd-cluster-aware score against, learned from the pods seen.

The extender has no trace: it learns the typical pods from the last pods it was
asked about, and the simulator, replaying as the extender would, learns the same
way from the pods as they arrive. Both use this one class, so a replay's
fragmentation scores are the ones the extender would have given. A pod's task
carries its GPUs, and the CPU and GPU models it asks for, as the paper's typical
pods do: fgd-cluster-aware reads both.

The distribution is re-read at the first pod and then every ``WORKLOAD_REFRESH`` new
pods, but a re-read is adopted only when it has drifted from the one in use by
``WORKLOAD_DRIFT`` or more, or the cluster changed: each adoption changes the scores
of every node, and so empties the memo of decisions, while a window of random
arrivals wobbles by a few percent from one re-read to the next without saying
anything new.

The extender defers an adoption (``defer``): a re-read that would be adopted waits as
``pending`` until the extender has scored its recent pod shapes under it between requests
and calls ``adopt``, so no pod pays for scoring every node again. The simulator adopts at
once, as the deferral only moves when, not what, the extender decides. A first workload is
always adopted at once: until a pod was seen there are no scores worth keeping.
"""

from collections import deque
from collections.abc import Callable, Mapping
from itertools import chain
from typing import Final

from infergrid.constants import POLICY_FGD, POLICY_FGD_CLUSTER_AWARE
from infergrid.placement.fgd_cluster_aware import with_cluster
from infergrid.placement.fragmentation import WORKLOAD_WINDOW, Demand, Workload
from infergrid.placement.host import HostRequest
from infergrid.pod_request import PodGpuRequest

LEARNING: Final = (POLICY_FGD, POLICY_FGD_CLUSTER_AWARE)
"""The production policies that read the learned workload, and so the pod's CPU and the
nodes' (``host``) too; binpack and spread would learn for nothing."""

WORKLOAD_REFRESH: Final = 50
"""The request distribution is re-read after this many new pods, not after each one."""

WORKLOAD_DRIFT: Final = 0.2
"""A re-read is adopted when it moves this much popularity (total variation distance)."""

Cluster = Callable[[], tuple[Mapping[str, int], int]]
"""(GPUs of each model, CPU millicores in all) of the cluster, read at each re-read."""


def _no_cluster() -> tuple[Mapping[str, int], int]:
    return {}, 0


def pod_demands(request: PodGpuRequest, host: HostRequest | None = None) -> tuple[Demand, ...]:
    """The tasks a pod brings to the distribution: one per GPU container, the pod's CPU on
    its first (a pod asks for CPU once), its GPU models on each."""
    cpu = host.cpu_milli if host else 0
    models = host.gpu_models if host else frozenset()
    found = []
    for container in request.gpu_containers:
        demand = Demand.of(container, cpu, models)
        if demand is not None:
            found.append(demand)
            cpu = 0
    return tuple(found)


def drift(old: Workload, new: Workload) -> float:
    """Total variation distance between two distributions: the popularity that moved."""
    before, after = dict(old.tasks), dict(new.tasks)
    moved = (abs(before.get(d, 0.0) - after.get(d, 0.0)) for d in before.keys() | after.keys())
    return sum(moved) / 2


class LearnedWorkload:
    """The typical pods of the last ``WORKLOAD_WINDOW`` pods seen, with the cluster's shape
    (how contested each GPU model is, CPU per GPU) that fgd-cluster-aware reads."""

    def __init__(self, cluster: Cluster = _no_cluster, defer: bool = False) -> None:
        self._cluster = cluster
        self._defer = defer
        self._pending: tuple[tuple[tuple[tuple[str, int], ...], int], Workload] | None = None
        self._read_from_pods = False
        self._recent: deque[tuple[Demand, ...]] = deque(maxlen=WORKLOAD_WINDOW)
        self._seen: deque[str] = deque(maxlen=WORKLOAD_WINDOW)
        self._seen_set: set[str] = set()
        self._unread = 0
        self._shape = self._cluster_shape()
        self._workload = self._read(self._shape)

    def observe(self, uid: str, request: PodGpuRequest, host: HostRequest | None = None) -> None:
        """Counts a pod once (by ``uid``) into the distribution, with what it asks of the node
        (``host``, where known); pods without GPUs do not count."""
        demands = pod_demands(request, host)
        if uid in self._seen_set or not demands:
            return
        if len(self._seen) == self._seen.maxlen:
            self._seen_set.discard(self._seen[0])
        self._seen.append(uid)
        self._seen_set.add(uid)
        self._recent.append(demands)
        self._unread += 1

    def workload(self) -> Workload:
        """The distribution in use; re-read first when enough new pods were seen, and
        replaced (or, deferred, made ``pending``) when the re-read drifted or the cluster
        changed."""
        if self._unread and (self._unread >= WORKLOAD_REFRESH or len(self._recent) <= self._unread):
            self._unread = 0
            first, self._read_from_pods = not self._read_from_pods, True
            shape = self._cluster_shape()
            candidate = self._read(shape)
            if shape != self._shape or drift(self._workload, candidate) >= WORKLOAD_DRIFT:
                if self._defer and not first:
                    self._pending = (shape, candidate)
                else:
                    self._shape, self._workload, self._pending = shape, candidate, None
        return self._workload

    @property
    def pending(self) -> Workload | None:
        """A re-read waiting to be adopted (only where adoption is deferred)."""
        return None if self._pending is None else self._pending[1]

    def adopt(self, workload: Workload) -> bool:
        """Takes ``workload`` into use if it is still the pending one; a newer re-read may
        have replaced it meanwhile, and then nothing changes (False)."""
        if self._pending is None or self._pending[1] is not workload:
            return False
        (self._shape, self._workload), self._pending = self._pending, None
        return True

    def _cluster_shape(self) -> tuple[tuple[tuple[str, int], ...], int]:
        gpus_per_model, cpu_milli = self._cluster()
        return tuple(sorted(gpus_per_model.items())), cpu_milli

    def _read(self, shape: tuple[tuple[tuple[str, int], ...], int]) -> Workload:
        demands = chain.from_iterable(self._recent)
        return with_cluster(Workload.from_demands(demands), dict(shape[0]), shape[1])
