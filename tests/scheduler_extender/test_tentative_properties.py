"""Whatever kube-scheduler, the watch and the clock do, in any order, tentative reservations
never over-commit a GPU and never outlive their pod or their timeout."""

from __future__ import annotations

import asyncio
import copy
import json
from collections import defaultdict

from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infergrid.assignment_annotation import PodAssignment
from infergrid.constants import (
    ANNOTATION_PLACEMENT_POLICY,
    PLACEMENT_POLICIES,
    RESOURCE_GPU,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
)
from scheduler_extender.watch_cache import DELETED, MODIFIED
from tests.scheduler_extender.test_binder import ApiServer
from tests.scheduler_extender.test_http import FLEET
from tests.scheduler_extender.test_tentative import L4S, TIMEOUT_S, Clock, reserving

PODS = [f"p{i}" for i in range(6)]
CAPACITY = {g.uuid: g.memory_mib for n in FLEET.nodes if n.name in L4S for g in n.inventory.gpus}


def pod(name: str, limits: dict[str, str], policy: str) -> dict:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                     "resourceVersion": "1", "annotations": {ANNOTATION_PLACEMENT_POLICY: policy}},
        "spec": {"containers": [{"name": "engine", "resources": {"limits": limits}}]},
    }  # fmt: skip


limits = st.one_of(
    st.integers(1, 23034).map(lambda mib: {RESOURCE_VGPU: "1", RESOURCE_GPU_MEMORY: str(mib)}),
    st.integers(1, 4).map(lambda n: {RESOURCE_GPU: str(n)}),
)
pods = st.tuples(*(st.tuples(limits, st.sampled_from(PLACEMENT_POLICIES)) for _ in PODS))
steps = st.lists(
    st.one_of(
        st.tuples(st.just("filter"), st.sampled_from(PODS)),
        st.tuples(st.just("prioritize"), st.sampled_from(PODS)),
        st.tuples(st.just("bind"), st.sampled_from(PODS), st.sampled_from(L4S)),
        st.tuples(st.just("watch"), st.sampled_from(PODS)),
        st.tuples(st.just("delete"), st.sampled_from(PODS)),
        st.tuples(st.just("wait"), st.floats(0, 2 * TIMEOUT_S)),
    ),
    max_size=25,
)


def over_commits(assignments: list[PodAssignment]) -> list[str]:
    """Each GPU given whole to one pod and also to another, or shared past its memory."""
    whole, shared = defaultdict(int), defaultdict(int)
    for assignment in assignments:
        for container in assignment.containers:
            for gpu in container.gpus:
                if container.shared:
                    shared[gpu.uuid] += gpu.memory_mib
                else:
                    whole[gpu.uuid] += 1
    return [
        uuid
        for uuid in CAPACITY
        if whole[uuid] > 1 or (whole[uuid] and shared[uuid]) or shared[uuid] > CAPACITY[uuid]
    ]


class Cluster:
    """The extender with holds on, the API server behind it, and a watch delivered by hand."""

    def __init__(self, specs) -> None:
        self.clock = Clock()
        self.api = ApiServer(
            *(pod(n, lim, policy) for n, (lim, policy) in zip(PODS, specs, strict=True))
        )
        self.svc = reserving(self.api, self.clock)
        self.deleted: set[str] = set()

    def body(self, name: str) -> dict:
        return {"Pod": copy.deepcopy(self.api.pods.get(name) or pod(name, {}, "binpack")),
                "NodeNames": L4S}  # fmt: skip

    async def step(self, http, kind: str, *args) -> None:
        cache = self.svc.view.cache
        if kind in ("filter", "prioritize"):
            await http.post(f"/{kind}", data=json.dumps(self.body(args[0])).encode())
        elif kind == "bind":
            name, node = args
            bind = {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}",
                    "Node": node}  # fmt: skip
            await http.post("/bind", data=json.dumps(bind).encode())
        elif kind == "watch" and args[0] in self.api.pods:
            cache.apply_pod(MODIFIED, copy.deepcopy(self.api.pods[args[0]]))
        elif kind == "delete" and args[0] in self.api.pods:
            cache.apply_pod(DELETED, self.api.pods.pop(args[0]))
            self.deleted.add(f"uid-{args[0]}")
        elif kind == "wait":
            self.clock.now += args[0]
            self.svc.reserver.expire()

    def check(self) -> None:
        cache = self.svc.view.cache
        for node in L4S:
            assert over_commits(cache.assignments_on(node)) == [], node
        for uid in self.deleted:
            assert not cache.reserved(uid) and cache.tentative(uid) is None, uid

    def settle(self) -> None:
        """The watch catches up and every timeout passes: only what is recorded holds GPUs."""
        cache = self.svc.view.cache
        for live in self.api.pods.values():
            cache.apply_pod(MODIFIED, copy.deepcopy(live))
        self.clock.now += TIMEOUT_S
        self.svc.reserver.expire()
        assert cache.size()["reservations"] == 0
        recorded = [n for n, p in self.api.pods.items() if self.api.assignment(n)]
        held = [a for node in L4S for a in cache.assignments_on(node)]
        assert len(held) == len(recorded)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods, steps)
def test_no_sequence_over_commits_a_gpu_or_leaks_a_reservation(specs, sequence):
    cluster = Cluster(specs)

    async def go():
        async with TestClient(TestServer(cluster.svc.app())) as http:
            for step in sequence:
                await cluster.step(http, *step)
                cluster.check()

    asyncio.run(go())
    cluster.settle()
