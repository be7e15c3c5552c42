"""Preemption for claim pods that filter never sees: kube-scheduler's DRA plugin refused every
node, so the extender's leader finds them among the pending pods and preempts for them."""

from __future__ import annotations

import asyncio
import copy

from scheduler_extender.claim_preemption import preempt_round, waiting_for_claims
from scheduler_extender.preemptor import Preemptor
from tests.scheduler_extender.dra_objects import claim_pod, whole_request
from tests.scheduler_extender.test_dra_verbs import DRA, asking, dra_service, holding
from tests.scheduler_extender.test_http import NOW
from tests.scheduler_extender.test_preempt import Clock, Evictions

REFUSED = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}


def refused(pod: dict, created: str = "2026-12-05T10:00:00Z") -> dict:
    """``pod`` as kube-scheduler leaves it after finding no node."""
    pod = copy.deepcopy(pod)
    pod["metadata"]["creationTimestamp"] = created
    pod["status"]["conditions"] = [REFUSED]
    return pod


def test_only_unbound_claim_pods_kube_scheduler_refused_wait_for_claims():
    waiting = refused(claim_pod("waiting", {"gpu": "c"}), "2026-12-05T10:00:02Z")
    older = refused(claim_pod("older", {"gpu": "d"}), "2026-12-05T10:00:01Z")
    untried = claim_pod("untried", {"gpu": "e"})
    bound = refused(claim_pod("bound", {"gpu": "f"}, node="dra-a"))
    leaving = refused(claim_pod("leaving", {"gpu": "g"}))
    leaving["metadata"]["deletionTimestamp"] = "2026-12-05T10:01:00Z"
    plugin_pod = refused(claim_pod("plugin", {}))
    plugin_pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    scheduled = claim_pod("scheduled", {"gpu": "h"})
    scheduled["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    pods = [waiting, untried, bound, leaving, plugin_pod, scheduled, older]
    assert [p["metadata"]["name"] for p in waiting_for_claims(pods)] == ["older", "waiting"]


def test_a_refused_claim_pod_evicts_the_cheapest_lower_priority_claim_holder_and_holds_room():
    pod, its_claim = asking("online", whole_request(), priority=1000)
    holders = [
        *holding("batch-0", "dra-a", "gpu-0"),
        *holding("batch-1", "dra-a", "gpu-1", mib=1024),
        *holding("batch-2", "dra-b", "gpu-0"),
        *holding("batch-3", "dra-b", "gpu-1"),
    ]
    evictions = Evictions()
    svc = dra_service(its_claim, *holders)
    preemptor = Preemptor(svc.view, "binpack", evictions, evictions.announce, hold_s=60,
                          monotonic=Clock(), retry_s=600)  # fmt: skip
    waiting = waiting_for_claims([refused(pod)])
    asyncio.run(preempt_round(waiting, preemptor, DRA, NOW))
    assert evictions.asked == ["batch-1"]
    assert svc.view.cache.tentative("online").node == "dra-a"
    # The next round, while the victim terminates, evicts no one else.
    asyncio.run(preempt_round(waiting, preemptor, DRA, NOW))
    assert evictions.asked == ["batch-1"]


def test_a_claim_pod_of_no_higher_priority_evicts_no_one():
    pod, its_claim = asking("peer", whole_request(), priority=0)
    holders = [*holding("batch-0", "dra-a", "gpu-0"), *holding("batch-1", "dra-a", "gpu-1")]
    evictions = Evictions()
    svc = dra_service(its_claim, *holders)
    preemptor = Preemptor(svc.view, "binpack", evictions, evictions.announce, hold_s=60,
                          monotonic=Clock(), retry_s=600)  # fmt: skip
    asyncio.run(preempt_round(waiting_for_claims([refused(pod)]), preemptor, DRA, NOW))
    assert evictions.asked == []
    assert svc.view.cache.tentative("peer") is None
