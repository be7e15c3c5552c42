"""The preempt verb over real HTTP: for each node kube-scheduler proposes, the fewest
lower-priority GPU holders of a preemptible class whose eviction lets the pod fit, or no
node at all."""

from __future__ import annotations

from infergrid.assignment_annotation import (
    AssignedGpu,
    ContainerAssignment,
    PodAssignment,
    encode_assignment,
)
from infergrid.constants import ANNOTATION_GPU_ASSIGNMENT, RESOURCE_GPU
from scheduler_extender.preemptor import Preemptor
from scheduler_extender.watch_cache import ADDED, DELETED
from tests.scheduler_extender.test_http import FLEET, NOW, call, service, share_pod

L4 = next(n for n in FLEET.nodes if n.name == "l4-0").inventory.gpus  # 4 GPUs of 23034 MiB
ONLINE, OFFLINE = 1000, 0
CLASS_OF = {ONLINE: "infergrid-online", OFFLINE: "infergrid-offline"}  # the extender's default


def holder(
    uid: str, priority: int, gpu: int, mib: int, node: str = "l4-0", klass: str | None = None
) -> dict:
    """A running pod holding a share of the node's GPU `gpu`, at `priority`, of the chart's
    class of that priority unless `klass` says ("": none)."""
    share = ContainerAssignment("engine", gpus=(AssignedGpu(L4[gpu].uuid, mib, 30),), shared=True)
    assignment = encode_assignment(PodAssignment(node, NOW, (share,)))
    klass = CLASS_OF.get(priority, "") if klass is None else klass
    return {
        "metadata": {"name": uid, "namespace": "batch", "uid": uid,
                     "annotations": {ANNOTATION_GPU_ASSIGNMENT: assignment}},
        "spec": {"nodeName": node, "priority": priority, "containers": [],
                 **({"priorityClassName": klass} if klass else {})},
        "status": {"phase": "Running"},
    }  # fmt: skip


def whole_gpu_pod(priority: int) -> dict:
    limits = {RESOURCE_GPU: "1"}
    return {
        "metadata": {"name": "online", "namespace": "serve", "uid": "online"},
        "spec": {"priority": priority,
                 "containers": [{"name": "engine", "resources": {"limits": limits}}]},
    }  # fmt: skip


def filled_service(pods: list[dict]):
    svc = service()
    for pod in pods:
        svc.view.cache.apply_pod(ADDED, pod)
    return svc


def preempt(svc, pod: dict, nodes: dict[str, list[str]]) -> dict:
    body = {"Pod": pod, "NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": 0}
        for node, uids in nodes.items()}}  # fmt: skip
    status, result = call(svc, "/preempt", body)
    assert status == 200, result
    return {
        node: [p["UID"] for p in v["Pods"]] for node, v in result["NodeNameToMetaVictims"].items()
    }


# Every GPU of l4-0 busy: two offline shares on GPU 0, one each on GPUs 1 and 2, an online one on 3.
BUSY = [
    holder("batch-a", OFFLINE, 0, 8000),
    holder("batch-b", OFFLINE, 0, 8000),
    holder("batch-c", OFFLINE, 1, 16000),
    holder("batch-d", OFFLINE, 2, 20000),
    holder("serve-e", ONLINE, 3, 20000),
]


def test_a_whole_gpu_evicts_the_one_offline_share_that_frees_a_gpu():
    victims = preempt(filled_service(BUSY), whole_gpu_pod(ONLINE), {"l4-0": []})
    assert victims == {"l4-0": ["batch-c"]}  # one victim; c holds less than d


def test_a_node_where_only_equal_priority_pods_hold_gpus_is_dropped():
    pods = [holder(f"serve-{i}", ONLINE, i, 20000) for i in range(4)]
    assert preempt(filled_service(pods), whole_gpu_pod(ONLINE), {"l4-0": []}) == {}


def test_kube_schedulers_own_victims_stay_and_their_gpus_count_as_freed():
    """It proposed batch-d (for CPU, say): that frees GPU 2, so nobody else need go."""
    victims = preempt(filled_service(BUSY), whole_gpu_pod(ONLINE), {"l4-0": ["batch-d"]})
    assert victims == {"l4-0": ["batch-d"]}


def test_a_pod_that_fits_keeps_the_node_with_no_more_victims():
    victims = preempt(filled_service(BUSY[:1]), whole_gpu_pod(ONLINE), {"l4-0": []})
    assert victims == {"l4-0": []}


def test_unknown_nodes_are_dropped_and_a_pod_without_gpus_is_not_judged():
    svc = filled_service(BUSY)
    assert preempt(svc, whole_gpu_pod(ONLINE), {"nowhere": []}) == {}
    cpu_only = {"metadata": {"name": "c", "namespace": "n", "uid": "c"},
                "spec": {"containers": [{"name": "c"}]}}  # fmt: skip
    assert preempt(svc, cpu_only, {"l4-0": ["batch-a"]}) == {"l4-0": ["batch-a"]}


def test_a_share_evicts_the_one_offline_share_whose_room_is_enough_and_smallest():
    """10000 MiB: GPU 0 less batch-a has 15034 free, as much as needed with the least evicted."""
    pod = share_pod(10000)
    pod["spec"]["priority"] = ONLINE
    assert preempt(filled_service(BUSY), pod, {"l4-0": []}) == {"l4-0": ["batch-a"]}


# Another tenant's GPU pods, at priority 0: one without a class, one of a class of its own.
TENANTS = [
    holder("team-b-0", 0, 1, 16000, klass=""),
    holder("team-b-1", 0, 2, 20000, klass="team-b"),
]


def test_gpu_holders_outside_the_preemptible_classes_are_never_chosen():
    """Without them GPU 0's two offline shares are the only way: two victims, not one."""
    pods = [p for p in BUSY if p["metadata"]["uid"] not in ("batch-c", "batch-d")] + TENANTS
    victims = preempt(filled_service(pods), whole_gpu_pod(ONLINE), {"l4-0": []})
    assert victims == {"l4-0": ["batch-a", "batch-b"]}
    svc = filled_service(pods)
    svc.preemptible = frozenset({"infergrid-offline", "team-b"})
    assert preempt(svc, whole_gpu_pod(ONLINE), {"l4-0": []}) == {"l4-0": ["team-b-1"]}


def test_a_node_where_kube_scheduler_proposes_a_holder_outside_them_is_dropped():
    pods = BUSY + [holder("team-b-2", 0, 3, 1000, klass="")]
    svc = filled_service(pods)
    assert preempt(svc, whole_gpu_pod(ONLINE), {"l4-0": ["team-b-2"]}) == {}
    assert preempt(svc, whole_gpu_pod(ONLINE), {"l4-0": ["batch-d"]}) == {"l4-0": ["batch-d"]}


def test_malformed_victims_are_refused_naming_the_field():
    svc = service()
    bad = {"Pod": whole_gpu_pod(1), "NodeNameToMetaVictims": {"l4-0": {"Pods": [{}]}}}
    status, result = call(svc, "/preempt", bad)
    assert status == 400 and "NodeNameToMetaVictims['l4-0'].Pods" in result["Error"]
    status, result = call(svc, "/preempt", {"NodeNameToMetaVictims": {}})
    assert status == 400 and "Pod" in result["Error"]


# Preemption the extender leads: kube-scheduler's dry run never sees GPU memory.


class Evictions:
    """The Eviction and Event APIs across the seam: records each eviction asked for, and each
    event as (pod uid, reason)."""

    def __init__(self, refuse: str | None = None):
        self.asked: list[str] = []
        self.events: list[tuple[str, str]] = []
        self.messages: list[tuple[str, str]] = []
        self.refuse = refuse

    async def __call__(self, namespace: str, name: str, uid: str) -> str | None:
        self.asked.append(uid)
        return self.refuse

    async def announce(self, pod, reason: str, message: str, kind: str = "Normal") -> None:
        self.events.append((pod.uid, reason))
        self.messages.append((kind, message))


class Clock:
    """The preemptor's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def leading_service(pods: list[dict], evictions: Evictions, clock: Clock | None = None):
    svc = filled_service(pods)
    svc.preemptor = Preemptor(svc.view, "binpack", evictions, evictions.announce, hold_s=60,
                              monotonic=clock or Clock(), retry_s=600)  # fmt: skip
    return svc


def filter_on(svc, pod: dict, nodes: list[str]) -> dict:
    status, result = call(svc, "/filter", {"Pod": pod, "NodeNames": nodes})
    assert status == 200
    return result


def test_a_refused_online_pod_evicts_the_fewest_offline_pods_and_its_room_is_held():
    evictions = Evictions()
    svc = leading_service(BUSY, evictions)
    result = filter_on(svc, whole_gpu_pod(ONLINE), ["l4-0"])
    assert result["NodeNames"] == [] and "l4-0" in result["FailedNodes"]
    assert evictions.asked == ["batch-c"]
    assert evictions.events == [("online", "Preempting"), ("batch-c", "Preempted")]
    assert svc.view.cache.tentative("online").node == "l4-0"
    # The victim is still terminating: the pod is refused again, and nobody else is evicted.
    filter_on(svc, whole_gpu_pod(ONLINE), ["l4-0"])
    assert evictions.asked == ["batch-c"]
    # Once it has gone, a new offline share (7500 MiB: only GPU 1 could take it) finds the
    # room held, and the online pod fits there.
    victim = next(p for p in BUSY if p["metadata"]["uid"] == "batch-c")
    svc.view.cache.apply_pod(DELETED, victim)
    replacement = share_pod(7500)
    replacement["metadata"]["uid"] = "batch-c2"
    assert filter_on(svc, replacement, ["l4-0"])["NodeNames"] == []
    assert filter_on(svc, whole_gpu_pod(ONLINE), ["l4-0"])["NodeNames"] == ["l4-0"]


def test_a_refused_eviction_frees_the_held_room_and_stops_preemption_with_a_warning():
    evictions = Evictions(refuse="403 Forbidden")  # RBAC or an admission policy
    svc = leading_service(BUSY, evictions)
    filter_on(svc, whole_gpu_pod(ONLINE), ["l4-0"])
    assert evictions.asked == ["batch-c"]
    assert evictions.events == [("online", "Preempting"), ("online", "PreemptionGivenUp")]
    kind, message = evictions.messages[-1]
    assert kind == "Warning" and "batch/batch-c" in message and "403 Forbidden" in message
    assert svc.view.cache.tentative("online") is None
    # The pod is refused again and again while it waits: nobody else is evicted.
    for _ in range(20):
        filter_on(svc, whole_gpu_pod(ONLINE), ["l4-0"])
    assert evictions.asked == ["batch-c"]


def test_preemption_that_stopped_plans_again_once_the_refused_victim_is_gone():
    evictions = Evictions(refuse="403 Forbidden")
    svc = leading_service(BUSY, evictions)
    filter_on(svc, whole_gpu_pod(ONLINE), ["l4-0"])
    evictions.refuse = None
    victim = next(p for p in BUSY if p["metadata"]["uid"] == "batch-c")
    svc.view.cache.apply_pod(DELETED, victim)  # gone by other hands: the room is there now
    assert filter_on(svc, whole_gpu_pod(ONLINE), ["l4-0"])["NodeNames"] == ["l4-0"]
    assert evictions.asked == ["batch-c"]


def test_preemption_that_stopped_plans_again_after_the_retry_time():
    evictions, clock = Evictions(refuse="403 Forbidden"), Clock()
    svc = leading_service(BUSY, evictions, clock)
    filter_on(svc, whole_gpu_pod(ONLINE), ["l4-0"])
    clock.now = 599.0
    filter_on(svc, whole_gpu_pod(ONLINE), ["l4-0"])
    assert evictions.asked == ["batch-c"]
    clock.now = 600.0
    filter_on(svc, whole_gpu_pod(ONLINE), ["l4-0"])
    assert evictions.asked == ["batch-c", "batch-c"]


def test_offline_pods_and_pods_without_priority_never_preempt():
    evictions = Evictions()
    svc = leading_service(BUSY, evictions)
    never = whole_gpu_pod(ONLINE)
    never["spec"]["preemptionPolicy"] = "Never"
    filter_on(svc, never, ["l4-0"])
    filter_on(svc, whole_gpu_pod(0), ["l4-0"])
    assert evictions.asked == []


def test_nobody_is_evicted_where_evicting_everyone_evictable_would_not_make_room():
    evictions = Evictions()
    svc = leading_service([holder(f"serve-{i}", ONLINE, i, 20000) for i in range(4)], evictions)
    filter_on(svc, whole_gpu_pod(ONLINE), ["l4-0"])
    assert evictions.asked == [] and svc.view.cache.tentative("online") is None


def test_a_follower_replica_evicts_nothing():
    evictions = Evictions()
    svc = leading_service(BUSY, evictions)
    svc.is_leader = lambda: False
    filter_on(svc, whole_gpu_pod(ONLINE), ["l4-0"])
    assert evictions.asked == []


def test_the_extender_evicts_no_gpu_holder_outside_the_preemptible_classes():
    """A bully of the online class, on a node of other tenants' classless GPU pods: nobody is
    evicted and no room is held, however often it is filtered."""
    evictions = Evictions()
    pods = [holder(f"team-b-{i}", 0, i, 20000, klass="") for i in range(4)]
    svc = leading_service(pods, evictions)
    for _ in range(3):
        filter_on(svc, whole_gpu_pod(ONLINE), ["l4-0"])
    assert evictions.asked == [] and svc.view.cache.tentative("online") is None
