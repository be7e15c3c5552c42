"""One ledger across both modes: in a cluster of device-plugin and DRA nodes, a burst of
device-plugin pods and claim pods decided through the extender's filter and bind, with claims
allocated by a model of kube-scheduler's DRA allocator, never holds a GPU beyond its memory
(or twice whole, or whole and shared), and the extender's free view is the truth after every
step."""

from __future__ import annotations

import asyncio
import copy
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infergrid import dra_ledger, dra_slices
from infergrid.assignment_annotation import decode_assignment
from infergrid.constants import (
    ANNOTATION_GPU_ASSIGNMENT,
    ANNOTATION_GPU_INVENTORY,
    ANNOTATION_GPU_USAGE,
    RESOURCE_GPU,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
)
from infergrid.inventory import Gpu, GpuInventory, encode_inventory
from infergrid.usage import encode_usage
from scheduler_extender import decisions
from scheduler_extender.binder import Binder
from scheduler_extender.protocol import BindingArgs
from scheduler_extender.view import PlacementView
from scheduler_extender.watch_cache import ADDED, DELETED, MODIFIED, ClusterCache
from tests.scheduler_extender.dra_objects import (
    claim,
    claim_pod,
    gpu,
    resource_slice,
    share_request,
    whole_request,
)
from tests.scheduler_extender.test_binder import ApiServer
from tests.scheduler_extender.test_http import NOW

MIB = 24576
PLUGIN = ["dp-0", "dp-1"]
DRA = ["dra-0", "dra-1"]
NODES = PLUGIN + DRA
GPUS = 2


def plugin_node(name: str) -> dict:
    gpus = tuple(Gpu(f"GPU-{name}-{i}", i, "NVIDIA L40", MIB, 142, "8.9", 0, True)
                 for i in range(GPUS))  # fmt: skip
    inventory = GpuInventory(name, gpus)
    annotations = {
        ANNOTATION_GPU_INVENTORY: encode_inventory(inventory),
        ANNOTATION_GPU_USAGE: encode_usage(dra_slices.idle_usage(inventory)),
    }
    return {"metadata": {"name": name, "annotations": annotations}}


def plugin_pod(uid: str, limits: dict[str, str]) -> dict:
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "default", "resourceVersion": "1"},
        "spec": {"containers": [{"name": "engine", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


@dataclass
class Allocator:
    """kube-scheduler's DRA allocator, as far as capacity goes: any device of the node with
    enough memory and cores left, the GPU exclusive when a claim asks no capacity (it then
    consumes the defaults: all the memory)."""

    held: dict[tuple[str, str], list[tuple[int, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )

    def left(self, node: str, device: str) -> tuple[int, int]:
        taken = self.held[(node, device)]
        return MIB - sum(m for m, _ in taken), 100 - sum(c for _, c in taken)

    def fitting(self, node: str, memory: int | None, cores: int) -> list[str]:
        devices = [f"gpu-{i}" for i in range(GPUS)]
        if memory is None:
            return [d for d in devices if not self.held[(node, d)]]
        left = {d: self.left(node, d) for d in devices}
        return [d for d in devices if left[d][0] >= memory and left[d][1] >= cores]

    def allocate(self, node: str, device: str, memory: int | None, cores: int) -> dict:
        consumed = (MIB if memory is None else memory), cores
        self.held[(node, device)].append(consumed)
        found = {"request": "gpu", "driver": "gpu.infergrid.io", "pool": node, "device": device}
        found["consumedCapacity"] = {"memory": f"{consumed[0]}Mi", "cores": str(cores)}
        return found

    def free(self, node: str, device: str, memory: int | None, cores: int) -> None:
        self.held[(node, device)].remove(((MIB if memory is None else memory), cores))


@dataclass
class Burst:
    """The cluster: the extender (cache, view, binder), the API server and the allocator."""

    cache: ClusterCache
    view: PlacementView
    api: ApiServer
    binder: Binder
    allocator: Allocator = field(default_factory=Allocator)
    claims: dict[str, tuple[dict, str, str, int | None, int]] = field(default_factory=dict)
    """Per claim pod: its claim, and where and what it got."""

    @classmethod
    def start(cls) -> Burst:
        cache = ClusterCache()
        for name in PLUGIN:
            cache.apply_node(ADDED, plugin_node(name))
        for name in DRA:
            cache.apply_node(ADDED, {"metadata": {"name": name}})
            devices = [gpu(i, name, memory_mib=MIB) for i in range(GPUS)]
            cache.apply_slice(ADDED, resource_slice(name, devices))
        view = PlacementView(cache, timedelta(days=1))
        api = ApiServer()
        return cls(cache, view, api, Binder(api, view, "binpack", clock=lambda: NOW))

    def bind(self, uid: str, node: str) -> None:
        args = BindingArgs(uid, "default", uid, node)
        asyncio.run(self.binder.bind(args))
        self.cache.apply_pod(MODIFIED, self.api.pods[uid])  # the watch shows it bound

    def plugin(self, uid: str, limits: dict[str, str], choice: int) -> None:
        pod = plugin_pod(uid, limits)
        self.api.pods[uid] = copy.deepcopy(pod)
        self.cache.apply_pod(ADDED, pod)
        passed = decisions.filter_nodes(pod, NODES, self.view, "binpack", NOW).passed
        assert not set(passed) & set(DRA), "a device-plugin pod passed a DRA node"
        if passed:
            self.bind(uid, passed[choice % len(passed)])

    def by_claim(self, uid: str, memory: int | None, cores: int, choice: int) -> None:
        asked = share_request(memory_mib=memory, cores=cores or None) if memory else None
        request = asked or whole_request()
        body = claim(f"{uid}-gpu", [request], uid=f"claim-{uid}")
        pod = claim_pod(uid, {"gpu": f"{uid}-gpu"})
        self.api.pods[uid] = copy.deepcopy(pod)
        self.cache.apply_claim(ADDED, body)
        self.cache.apply_pod(ADDED, pod)
        passed = decisions.filter_nodes(pod, NODES, self.view, "binpack", NOW).passed
        room = [n for n in DRA if self.allocator.fitting(n, memory, cores)]
        assert passed == room, f"filter passed {passed}; the allocator has room on {room}"
        if not passed:
            return
        node = passed[choice % len(passed)]
        devices = self.allocator.fitting(node, memory, cores)
        device = devices[choice % len(devices)]
        result = self.allocator.allocate(node, device, memory, cores)
        body["status"] = {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": uid, "uid": uid}],
        }
        self.claims[uid] = (body, node, device, memory, cores)
        self.cache.apply_claim(MODIFIED, body)  # PreBind wrote it before bind
        self.bind(uid, node)

    def delete(self, choice: int) -> None:
        bound = sorted(u for u, p in self.api.pods.items() if p["spec"].get("nodeName"))
        if not bound:
            return
        uid = bound[choice % len(bound)]
        self.cache.apply_pod(DELETED, self.api.pods.pop(uid))
        if uid in self.claims:
            body, node, device, memory, cores = self.claims.pop(uid)
            self.allocator.free(node, device, memory, cores)
            self.cache.apply_claim(DELETED, body)

    def truth(self) -> dict[str, dict[str, int]]:
        """Per node, per GPU uuid, the memory held: assignments on device-plugin nodes, the
        allocator's own record on DRA nodes. Checks no GPU is held past its memory, twice
        whole, or whole and shared."""
        held: dict[str, dict[str, int]] = {n: defaultdict(int) for n in NODES}
        whole: dict[str, int] = defaultdict(int)
        shared: dict[str, int] = defaultdict(int)
        for pod in self.api.pods.values():
            text = pod["metadata"].get("annotations", {}).get(ANNOTATION_GPU_ASSIGNMENT)
            if text is None:
                continue
            assignment = decode_assignment(text)
            for container in assignment.containers:
                for g in container.gpus:
                    held[assignment.node][g.uuid] += g.memory_mib
                    (shared if container.shared else whole)[g.uuid] += 1
        for (node, device), taken in self.allocator.held.items():
            uuid = f"GPU-{node}-{device.removeprefix('gpu-')}"
            for memory, _ in taken:
                held[node][uuid] += memory
                (whole if memory == MIB else shared)[uuid] += 1
        for gpus in held.values():
            for uuid, memory in gpus.items():
                assert memory <= MIB, f"{uuid} holds {memory} MiB of {MIB}"
                assert whole[uuid] <= 1 and not (whole[uuid] and shared[uuid]), uuid
        return {n: dict(g) for n, g in held.items()}

    def seen(self) -> dict[str, dict[str, int]]:
        """What the extender's cache says each GPU holds, built as filter builds it."""
        found = {}
        for name in NODES:
            state = self.view.node_state(name, NOW)
            assert not isinstance(state, str) and not state.issues, state
            found[name] = {g.uuid: g.assigned_mib for g in state.gpus if g.assigned_mib}
        return found


shares = st.integers(1, MIB)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("plugin-share"), shares, st.integers(0, 9)),
        st.tuples(st.just("plugin-whole"), st.integers(1, 2), st.integers(0, 9)),
        st.tuples(st.just("claim-share"), shares, st.sampled_from([0, 0, 30, 60])),
        st.tuples(st.just("claim-whole"), st.integers(0, 9)),
        st.tuples(st.just("delete"), st.integers(0, 99)),
    ),
    max_size=24,
)


def run(ops: list[tuple]) -> None:
    burst = Burst.start()
    for at, op in enumerate(ops):
        uid = f"p{at}"
        kind = op[0]
        if kind == "plugin-share":
            burst.plugin(uid, {RESOURCE_VGPU: "1", RESOURCE_GPU_MEMORY: str(op[1])}, op[2])
        elif kind == "plugin-whole":
            burst.plugin(uid, {RESOURCE_GPU: str(op[1])}, op[2])
        elif kind == "claim-share":
            burst.by_claim(uid, op[1], op[2], at)
        elif kind == "claim-whole":
            burst.by_claim(uid, None, 0, op[1])
        else:
            burst.delete(op[1])
        truth = {n: {u: m for u, m in g.items() if m} for n, g in burst.truth().items()}
        assert burst.seen() == truth, f"after step {at}: {op}"
        assert burst.cache.size()["reservations"] == 0


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_no_gpu_is_held_twice_and_the_extenders_view_is_the_truth(ops):
    run(ops)


def test_the_property_catches_a_claim_reader_that_miscounts_a_share(monkeypatch):
    """A reader that charges a share a tenth of what it consumed: the extender's view drifts
    from the truth at once, and filter soon passes a node the allocator has no room on."""
    real = dra_ledger.holdings

    def miscounting(claim, devices):
        found = real(claim, devices)
        return tuple(
            c if not c.shared else type(c)(c.name, (type(c.gpus[0])(
                c.gpus[0].uuid, max(1, c.gpus[0].memory_mib // 10), c.gpus[0].cores),),
                allocated=True, shared=True)
            for c in found
        )  # fmt: skip

    monkeypatch.setattr("scheduler_extender.claims.holdings", miscounting)
    with pytest.raises(AssertionError, match="after step 0"):
        run([("claim-share", 20000, 0)])
    with pytest.raises(AssertionError):
        run([("claim-share", 20000, 0), ("claim-share", 20000, 0)])
