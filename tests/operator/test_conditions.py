"""Status and conditions from what the Deployments and pods report."""

from __future__ import annotations

from inference_operator.conditions import (
    compute_conditions,
    compute_status,
    merge_conditions,
    observe_deployment,
    refused_conditions,
    status_patch,
    transitions,
)

UNSCHEDULABLE = "0/5 nodes are available: 5 GPU 0 has 0 MiB free, needs 8192."


def deployment(replicas=2, ready=2, updated=2, available=None, generation=1, observed=1,
               conditions=()):  # fmt: skip
    return {
        "metadata": {"name": "chat", "generation": generation},
        "spec": {"replicas": replicas},
        "status": {"observedGeneration": observed, "replicas": replicas, "readyReplicas": ready,
                   "updatedReplicas": updated,
                   "availableReplicas": ready if available is None else available,
                   "conditions": list(conditions)},
    }  # fmt: skip


def pod(name="p", node="a100-0", ready=True, scheduled_message=None, deleting=False):
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if scheduled_message:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                           "message": scheduled_message})  # fmt: skip
    meta = {"name": name, "namespace": "ns"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status = {"conditions": conditions, "podIP": "10.0.0.1" if node else None,
              "phase": "Running" if node else "Pending"}  # fmt: skip
    return {"metadata": meta, "spec": {"nodeName": node}, "status": status}


def by_type(conditions):
    return {c["type"]: (c["status"], c["reason"]) for c in conditions}


def test_all_replicas_ready_and_rolled_out_is_ready():
    tracks = {"stable": observe_deployment(deployment(), 2)}
    got = by_type(compute_conditions(tracks, [pod("a"), pod("b")]))
    assert got == {
        "Ready": ("True", "AllReplicasReady"),
        "Scheduled": ("True", "AllPodsScheduled"),
        "Progressing": ("False", "RolloutComplete"),
        "Degraded": ("False", "AsExpected"),
    }


def test_a_pod_not_ready_yet_is_progress_not_readiness():
    tracks = {"stable": observe_deployment(deployment(ready=1, available=1), 2)}
    got = by_type(compute_conditions(tracks, [pod("a"), pod("b", ready=False)]))
    assert got["Ready"] == ("False", "ReplicasNotReady")
    assert got["Progressing"] == ("True", "RollingOut")


def test_an_unseen_generation_or_a_changed_count_is_not_rolled_out():
    assert not observe_deployment(deployment(generation=2, observed=1), 2).rolled_out
    assert not observe_deployment(deployment(), 3).rolled_out
    assert not observe_deployment(None, 1).rolled_out
    assert observe_deployment(deployment(), 2).rolled_out


def test_an_unschedulable_pod_carries_the_schedulers_message():
    tracks = {"stable": observe_deployment(deployment(ready=1, available=1), 2)}
    pods = [pod("a"), pod("b", node=None, ready=False, scheduled_message=UNSCHEDULABLE)]
    conditions = {c["type"]: c for c in compute_conditions(tracks, pods)}
    assert conditions["Scheduled"]["status"] == "False"
    assert conditions["Scheduled"]["message"] == f"1 of 2 pods cannot be scheduled: {UNSCHEDULABLE}"
    assert conditions["Degraded"]["reason"] == "Unschedulable"
    assert conditions["Ready"]["reason"] == "Unschedulable"
    assert UNSCHEDULABLE in conditions["Ready"]["message"]


def test_a_pod_waiting_for_the_scheduler_is_unknown_not_failed():
    tracks = {"stable": observe_deployment(deployment(ready=0, available=0), 1)}
    conditions = by_type(compute_conditions(tracks, [pod(node=None, ready=False)]))
    assert conditions["Scheduled"] == ("Unknown", "Pending")


def test_terminating_pods_are_ignored():
    tracks = {"stable": observe_deployment(deployment(replicas=1, ready=1, updated=1), 1)}
    pods = [pod("a"), pod("old", node=None, scheduled_message=UNSCHEDULABLE, deleting=True)]
    assert by_type(compute_conditions(tracks, pods))["Scheduled"] == ("True", "AllPodsScheduled")


def test_a_stalled_or_failing_deployment_is_degraded():
    stalled = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
               "message": "ReplicaSet chat-1 has timed out progressing."}  # fmt: skip
    tracks = {"stable": observe_deployment(deployment(conditions=[stalled]), 2)}
    got = by_type(compute_conditions(tracks, [pod("a"), pod("b")]))
    assert got["Degraded"] == ("True", "ProgressDeadlineExceeded")
    assert got["Progressing"] == ("False", "ProgressDeadlineExceeded")
    failure = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
               "message": "exceeded quota"}  # fmt: skip
    tracks = {"stable": observe_deployment(deployment(ready=0, conditions=[failure]), 2)}
    assert by_type(compute_conditions(tracks, []))["Degraded"] == ("True", "ReplicaFailure")


def test_scaled_to_zero_is_not_ready():
    tracks = {"stable": observe_deployment(deployment(replicas=0, ready=0, updated=0), 0)}
    assert by_type(compute_conditions(tracks, []))["Ready"] == ("False", "ScaledToZero")


def test_ready_needs_the_canary_too_and_status_splits_the_counts():
    tracks = {
        "stable": observe_deployment(deployment(), 2),
        "canary": observe_deployment(deployment(replicas=1, ready=0, updated=1, available=0), 1),
    }
    status = compute_status("chat", "ns", tracks, [pod("a"), pod("b")], [], "T0")
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "False"
    assert status["replicas"] == 2 and status["readyReplicas"] == 2
    assert status["canary"] == {"replicas": 1, "readyReplicas": 0}
    assert status["selector"] == "infergrid.io/inferenceservice=chat,infergrid.io/track=stable"
    assert status["url"] == "http://chat.ns.svc.cluster.local"


def test_without_a_canary_the_canary_status_is_removed():
    tracks = {"stable": observe_deployment(deployment(), 2)}
    status = compute_status("chat", "ns", tracks, [], [], "T0")
    assert status["canary"] is None
    assert status_patch({"canary": {"replicas": 1}}, status)["canary"] is None


def test_transition_time_moves_only_when_the_status_does():
    first = merge_conditions([], [{"type": "Ready", "status": "False"}], "T0")
    same = merge_conditions(first, [{"type": "Ready", "status": "False"}], "T1")
    flipped = merge_conditions(same, [{"type": "Ready", "status": "True"}], "T2")
    assert [c["lastTransitionTime"] for c in (*first, *same, *flipped)] == ["T0", "T0", "T2"]


def test_an_unchanged_status_needs_no_patch():
    tracks = {"stable": observe_deployment(deployment(), 2)}
    first = compute_status("chat", "ns", tracks, [pod("a"), pod("b")], [], "T0")
    again = compute_status("chat", "ns", tracks, [pod("a"), pod("b")], first["conditions"], "T9")
    current = {**first, "metrics": {"queueDepth": 1.0}}
    current.pop("canary")  # absent is as good as None
    assert status_patch(current, again) == {}


def test_events_are_posted_on_becoming_ready_and_on_degrading():
    before = [{"type": "Ready", "status": "False"}, {"type": "Degraded", "status": "False"}]
    after = [
        {"type": "Ready", "status": "True", "reason": "AllReplicasReady", "message": "2/2"},
        {"type": "Degraded", "status": "True", "reason": "Unschedulable", "message": "0/5"},
    ]
    assert transitions(before, after) == [
        ("Normal", "Ready", "2/2"),
        ("Warning", "Unschedulable", "0/5"),
    ]
    assert transitions(after, after) == []


def test_an_invalid_spec_keeps_other_conditions():
    previous = [{"type": "Scheduled", "status": "True", "lastTransitionTime": "T0"}]
    got = refused_conditions("InvalidSpec", "spec.resources: set one", previous, "T1")
    assert by_type(got[1:]) == {"Ready": ("False", "InvalidSpec"),
                                "Degraded": ("True", "InvalidSpec")}  # fmt: skip
    assert got[0]["type"] == "Scheduled"
