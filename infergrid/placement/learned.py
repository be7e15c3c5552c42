"""The workload fgd and fgd-cluster-aware score against, learned from the pods seen.

The extender has no trace: it learns the typical pods from the last pods it was
asked about, and the simulator, replaying as the extender would, learns the same
way from the pods as they arrive. Both use this one class, so a replay's
fragmentation scores are the ones the extender would have given.

The distribution is re-read only every ``WORKLOAD_REFRESH`` new pods (and after
each of the first ones, while it knows fewer than that): every re-read changes
the scores of every node, and so empties the memo of decisions.
"""

from collections import deque
from collections.abc import Callable, Mapping
from typing import Final

from infergrid.placement.fgd_cluster_aware import with_cluster
from infergrid.placement.fragmentation import WORKLOAD_WINDOW, Workload
from infergrid.pod_request import PodGpuRequest

WORKLOAD_REFRESH: Final = 50
"""The request distribution is re-read after this many new pods, not after each one."""

Cluster = Callable[[], tuple[Mapping[str, int], int]]
"""(GPUs of each model, CPU millicores in all) of the cluster, read at each re-read."""


def _no_cluster() -> tuple[Mapping[str, int], int]:
    return {}, 0


class LearnedWorkload:
    """The typical pods of the last ``WORKLOAD_WINDOW`` pods seen, with the cluster's shape
    (how contested each GPU model is, CPU per GPU) that fgd-cluster-aware reads."""

    def __init__(self, cluster: Cluster = _no_cluster) -> None:
        self._cluster = cluster
        self._recent: deque[PodGpuRequest] = deque(maxlen=WORKLOAD_WINDOW)
        self._seen: deque[str] = deque(maxlen=WORKLOAD_WINDOW)
        self._seen_set: set[str] = set()
        self._unread = 0
        self._workload = self._read(())

    def observe(self, uid: str, request: PodGpuRequest) -> None:
        """Counts a pod once (by ``uid``) into the distribution; pods without GPUs do not count."""
        if uid in self._seen_set or not request.gpu_containers:
            return
        if len(self._seen) == self._seen.maxlen:
            self._seen_set.discard(self._seen[0])
        self._seen.append(uid)
        self._seen_set.add(uid)
        self._recent.append(request)
        self._unread += 1

    def workload(self) -> Workload:
        """The distribution as last re-read; re-read first when enough new pods were seen."""
        if self._unread and (self._unread >= WORKLOAD_REFRESH or len(self._recent) <= self._unread):
            self._workload = self._read(self._recent)
            self._unread = 0
        return self._workload

    def _read(self, requests: "deque[PodGpuRequest] | tuple[()]") -> Workload:
        gpus_per_model, cpu_milli = self._cluster()
        return with_cluster(Workload.from_requests(requests), gpus_per_model, cpu_milli)
