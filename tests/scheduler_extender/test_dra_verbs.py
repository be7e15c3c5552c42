"""The verbs for a pod whose GPUs come by claim: only DRA nodes take it, by the same policy;
bind writes no assignment (the claim's allocation is one); the extender preempts for it."""

from __future__ import annotations

from infergrid.dra import RESOURCE_GPU_CLAIM
from scheduler_extender.binder import Binder
from scheduler_extender.preemptor import Preemptor
from scheduler_extender.tentative import Reserver
from scheduler_extender.watch_cache import ADDED, DELETED
from tests.scheduler_extender.dra_objects import (
    claim,
    claim_pod,
    gpu,
    resource_slice,
    result,
    share_request,
    whole_request,
)
from tests.scheduler_extender.test_binder import ApiServer
from tests.scheduler_extender.test_http import NAMES, NOW, call, service, share_pod
from tests.scheduler_extender.test_preempt import Clock, Evictions

DRA = ["dra-a", "dra-b"]
OFFLINE = "infergrid-offline"


def dra_service(*objects: dict):
    """The sample fleet (device plugin) and two DRA nodes of two A100s each; ``objects``
    are claims and pods the watch has delivered."""
    svc = service()
    cache = svc.view.cache
    for node in DRA:
        cache.apply_node(ADDED, {"metadata": {"name": node}})
        cache.apply_slice(ADDED, resource_slice(node, [gpu(0, node), gpu(1, node)]))
    for obj in objects:
        if obj.get("kind") == "ResourceClaim":
            cache.apply_claim(ADDED, obj)
        else:
            cache.apply_pod(ADDED, obj)
    return svc


def asking(uid: str, *requests: dict, priority: int = 0) -> tuple[dict, dict]:
    """A claim pod and its (unallocated) claim."""
    return claim_pod(uid, {"gpu": f"{uid}-gpu"}, priority=priority), claim(
        f"{uid}-gpu", list(requests)
    )


def holding(uid: str, node: str, device: str, priority: int = 0, mib: int | None = None):
    """A bound claim pod of the offline class and its claim, allocated on ``device``."""
    pod = claim_pod(uid, {"gpu": f"{uid}-gpu"}, priority, OFFLINE, node=node)
    request = whole_request() if mib is None else share_request(memory_mib=mib)
    held = claim(f"{uid}-gpu", [request], [result(device, node, memory_mib=mib)], (uid,))
    return pod, held


def filtered(svc, pod: dict, names: list[str]) -> dict:
    status, answer = call(svc, "/filter", {"Pod": pod, "NodeNames": names})
    assert status == 200
    return answer


def test_a_claim_pod_passes_only_dra_nodes_and_a_plugin_pod_only_plugin_nodes():
    pod, its_claim = asking("p", share_request(memory_mib=20480))
    svc = dra_service(its_claim)
    answer = filtered(svc, pod, NAMES + DRA)
    assert answer["NodeNames"] == DRA
    assert "through the device plugin" in answer["FailedAndUnresolvableNodes"]["h100"]
    plain = filtered(svc, share_pod(1024), NAMES + DRA)
    assert set(DRA) <= set(plain["FailedAndUnresolvableNodes"]) and "h100" in plain["NodeNames"]
    assert RESOURCE_GPU_CLAIM in plain["FailedAndUnresolvableNodes"]["dra-a"]


def test_a_claim_pod_fits_only_beside_what_claims_already_hold():
    pod, its_claim = asking("p", whole_request())
    svc = dra_service(
        its_claim, *holding("h0", "dra-a", "gpu-0"), *holding("h1", "dra-a", "gpu-1", mib=1024)
    )
    answer = filtered(svc, pod, DRA)
    assert answer["NodeNames"] == ["dra-b"] and "dra-a" in answer["FailedNodes"]
    share, share_claim = asking("s", share_request(memory_mib=70000))
    svc.view.cache.apply_claim(ADDED, share_claim)
    assert filtered(svc, share, ["dra-a"])["NodeNames"] == ["dra-a"]  # beside the 1 GiB share


def test_a_pod_whose_claim_is_not_there_yet_waits_on_every_node():
    pod, _ = asking("p", whole_request())
    answer = filtered(dra_service(), pod, DRA)
    assert (
        answer["NodeNames"] == []
        and "waiting for its ResourceClaim" in answer["FailedNodes"]["dra-a"]
    )


def test_an_unreadable_claim_fits_nowhere():
    pod, bad = asking("p", {"name": "gpu", "exactly": {"deviceClassName": "gpu.infergrid.io",
                                                        "allocationMode": "All"}})  # fmt: skip
    answer = filtered(dra_service(bad), pod, DRA)
    assert "allocationMode" in answer["FailedAndUnresolvableNodes"]["dra-a"]


def test_prioritize_scores_dra_nodes_by_the_pods_policy():
    pod, its_claim = asking("p", share_request(memory_mib=10240))
    svc = dra_service(its_claim, *holding("h", "dra-b", "gpu-0", mib=40960))
    status, scores = call(svc, "/prioritize", {"Pod": pod, "NodeNames": DRA})
    by_node = {s["Host"]: s["Score"] for s in scores}
    assert status == 200 and by_node["dra-b"] > by_node["dra-a"]  # binpack: the fuller one


def test_bind_of_a_claim_pod_creates_the_binding_without_an_assignment():
    pod, its_claim = asking("p", whole_request())
    api = ApiServer(pod)
    svc = dra_service(its_claim, pod)
    svc.binder = Binder(api, svc.view, "binpack", clock=lambda: NOW)
    args = {"PodName": "p", "PodNamespace": "default", "PodUID": "p", "Node": "dra-a"}
    status, answer = call(svc, "/bind", args)
    assert status == 200 and answer["Error"] == ""
    assert api.bound_to() == [("p", "dra-a")] and api.assignment("p") is None
    assert "annotations" not in api.bindings[0]["metadata"]


def test_a_tentative_hold_of_a_claim_pod_is_confirmed_without_an_assignment_until_its_claim_holds():
    pod, its_claim = asking("p", whole_request())
    api = ApiServer(pod)
    svc = dra_service(its_claim, pod)
    svc.reserver = Reserver(svc.view, "binpack", timeout_s=30, clock=lambda: NOW)
    svc.binder = Binder(api, svc.view, "binpack", clock=lambda: NOW)
    status, _ = call(svc, "/prioritize", {"Pod": pod, "NodeNames": DRA})
    held = svc.view.cache.tentative("p")
    assert status == 200 and held is not None
    args = {"PodName": "p", "PodNamespace": "default", "PodUID": "p", "Node": held.node}
    assert call(svc, "/bind", args)[1]["Error"] == ""
    assert api.assignment("p") is None and svc.view.cache.reserved("p")
    allocated = claim("p-gpu", [whole_request()], [result("gpu-1", held.node)], ("p",))
    svc.view.cache.apply_claim(ADDED, allocated)  # kube-scheduler's PreBind wrote it
    assert not svc.view.cache.reserved("p")
    assert svc.view.cache.size()["reservations"] == 0


def test_the_extender_preempts_lower_priority_claim_holders_for_a_claim_pod():
    pod, its_claim = asking("online", whole_request(), priority=1000)
    holders = [
        *holding("batch-0", "dra-a", "gpu-0"),
        *holding("batch-1", "dra-a", "gpu-1", mib=1024),
        *holding("batch-2", "dra-b", "gpu-0"),
        *holding("batch-3", "dra-b", "gpu-1"),
    ]
    evictions = Evictions()
    svc = dra_service(its_claim, *holders)
    svc.preemptor = Preemptor(svc.view, "binpack", evictions, evictions.announce, hold_s=60,
                              monotonic=Clock(), retry_s=600)  # fmt: skip
    answer = filtered(svc, pod, NAMES + DRA)
    assert answer["NodeNames"] == []
    assert evictions.asked == ["batch-1"]  # the smallest disruption: one 1 GiB share
    assert svc.view.cache.tentative("online").node == "dra-a"
    # Once the victim and its claim are gone, the room held is the online pod's alone.
    svc.view.cache.apply_pod(DELETED, holders[2])
    svc.view.cache.apply_claim(DELETED, holders[3])
    newcomer, newcomer_claim = asking("late", whole_request())
    svc.view.cache.apply_claim(ADDED, newcomer_claim)
    assert filtered(svc, newcomer, DRA)["NodeNames"] == []
    assert filtered(svc, pod, DRA)["NodeNames"] == ["dra-a"]


def test_kube_schedulers_preempt_verb_keeps_no_node_of_the_other_mode():
    pod, its_claim = asking("online", whole_request(), priority=1000)
    svc = dra_service(
        its_claim, *holding("batch", "dra-a", "gpu-0"), *holding("b2", "dra-a", "gpu-1")
    )
    body = {"Pod": pod, "NodeNameToMetaVictims": {"h100": {"Pods": []}, "dra-a": {"Pods": []}}}
    status, answer = call(svc, "/preempt", body)
    assert status == 200 and set(answer["NodeNameToMetaVictims"]) == {"dra-a"}
