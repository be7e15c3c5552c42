"""Pods on an unhealthy GPU: which conditions to write, and the loop that writes them."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from device_plugin.health import HealthTracker
from device_plugin.pod_health import (
    ConditionChange,
    GpuCondition,
    ObservedPod,
    PodHealthReporter,
    condition_changes,
    condition_patch,
    gpu_condition,
    held_gpus,
    warning_event,
)
from infergrid.inventory import Gpu, GpuInventory
from infergrid.records import PodRecord
from tests.device_plugin.conftest import mig, pod, share, whole

INDICES = {"GPU-0": 0, "GPU-1": 1, "GPU-2": 2}
LOST = "XID 79 (GPU has fallen off the bus): needs a GPU reset"
BROKEN_1 = GpuCondition("False", "GPUUnhealthy", f"GPU GPU-1 (index 1) is unhealthy: {LOST}")
NOW = datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)


def observed(record: PodRecord, condition: GpuCondition | None = None) -> ObservedPod:
    return ObservedPod(record, condition)


def changes_for(*pods: ObservedPod, unhealthy: dict[str, str] | None = None):
    return condition_changes(pods, unhealthy if unhealthy is not None else {"GPU-1": LOST}, INDICES)


@pytest.mark.parametrize(
    "container",
    [
        whole("c", "GPU-0", "GPU-1"),
        share("c", "GPU-1", 4096),
        mig("c", "MIG-1-0", "3g.40gb", "GPU-1"),
    ],
    ids=["whole", "share", "mig"],
)
def test_a_pod_holding_an_unhealthy_gpu_in_any_way_is_told_once(container):
    holder = observed(pod("p", "n", container))
    (change,) = changes_for(holder)
    assert change == ConditionChange(holder.pod, BROKEN_1, transition=True)
    assert change.warns
    assert changes_for(observed(holder.pod, BROKEN_1)) == []


def test_pods_on_healthy_gpus_and_pods_without_an_assignment_are_left_alone():
    healthy = observed(pod("a", "n", whole("c", "GPU-0")))
    unassigned = observed(PodRecord("uid-b", "default", "b", "n", "infergrid-scheduler", None))
    assert changes_for(healthy, unassigned) == []


def test_a_second_fault_on_the_pods_gpus_updates_the_message_without_a_new_event():
    holder = pod("p", "n", whole("c", "GPU-1", "GPU-2"))
    unhealthy = {"GPU-2": "XID 32", "GPU-1": LOST}
    (change,) = changes_for(observed(holder, BROKEN_1), unhealthy=unhealthy)
    assert change.condition.message == (
        f"GPU GPU-1 (index 1) is unhealthy: {LOST}; GPU GPU-2 (index 2) is unhealthy: XID 32"
    )
    assert not change.transition and not change.warns


def test_a_pod_told_of_a_fault_that_passed_is_told_its_gpus_are_healthy_again():
    holder = pod("p", "n", whole("c", "GPU-1", "GPU-0"))
    (change,) = changes_for(observed(holder, BROKEN_1), unhealthy={})
    healthy = "every GPU it holds is healthy: GPU-0 (index 0), GPU-1 (index 1)"
    assert change == ConditionChange(holder, GpuCondition("True", "GPUHealthy", healthy), True)
    assert not change.warns
    assert changes_for(observed(holder, change.condition), unhealthy={}) == []


def test_a_gpu_the_node_does_not_list_is_named_by_its_uuid_alone():
    (change,) = changes_for(observed(pod("p", "n", whole("c", "GPU-9"))), unhealthy={"GPU-9": "x"})
    assert change.condition.message == "GPU GPU-9 is unhealthy: x"


def test_held_gpus_are_in_index_order_with_unknown_gpus_last():
    holder = pod("p", "n", whole("a", "GPU-9", "GPU-2"), mig("b", "MIG-0", "1g.10gb", "GPU-0"))
    assert held_gpus(holder, INDICES) == ["GPU-0", "GPU-2", "GPU-9"]


# The decision against its definition, on random pods, assignments, faults and conditions.

uuids = st.sampled_from(sorted(INDICES) + ["GPU-9"])
containers = st.one_of(
    st.lists(uuids, min_size=1, max_size=3, unique=True).map(lambda u: whole("c", *u)),
    uuids.map(lambda u: share("c", u, 1024)),
    uuids.map(lambda u: mig("c", f"MIG-{u}", "1g.10gb", u)),
)
conditions = st.none() | st.builds(
    GpuCondition, st.sampled_from(["True", "False"]), st.just("r"), st.just("m")
)


@st.composite
def situations(draw: st.DrawFn) -> tuple[list[ObservedPod], dict[str, str]]:
    count = draw(st.integers(0, 5))
    pods = [observed(pod(f"p{i}", "n", draw(containers)), draw(conditions)) for i in range(count)]
    unhealthy = draw(st.dictionaries(uuids, st.sampled_from(["XID 32", LOST]), max_size=3))
    return pods, unhealthy


@given(situations())
def test_after_the_changes_every_pod_says_what_its_gpus_are_and_a_round_later_nothing(case):
    pods, unhealthy = case
    changes = condition_changes(pods, unhealthy, INDICES)
    by_uid = {change.pod.uid: change for change in changes}
    assert len(by_uid) == len(changes)
    after = [
        observed(o.pod, by_uid[o.pod.uid].condition) if o.pod.uid in by_uid else o for o in pods
    ]
    for before, now in zip(pods, after, strict=True):
        faulty = set(held_gpus(now.pod, INDICES)) & set(unhealthy)
        if faulty:
            assert now.condition.status == "False"
            assert all(uuid in now.condition.message for uuid in faulty)
        elif before.condition is None:
            assert now.condition is None
        else:
            assert now.condition.status == "True"
        change = by_uid.get(now.pod.uid)
        told = before.condition is not None and before.condition.status == "False"
        assert (change is not None and change.warns) == (bool(faulty) and not told)
    assert condition_changes(after, unhealthy, INDICES) == []


# What the API server is sent, and read back.


def test_the_condition_is_read_from_the_pods_status_among_others():
    body = {
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                "not a condition",
                {"type": "infergrid.io/GPUHealthy", "status": "False", "reason": "GPUUnhealthy",
                 "message": BROKEN_1.message},
            ]
        }
    }  # fmt: skip
    assert gpu_condition(body) == BROKEN_1
    assert gpu_condition({"status": {"conditions": [{"type": "Ready"}]}}) is None
    assert gpu_condition({"metadata": {}}) is None


def test_the_patch_merges_one_condition_and_moves_its_time_only_with_the_status():
    holder = pod("p", "n", whole("c", "GPU-1"))
    patch = condition_patch(ConditionChange(holder, BROKEN_1, transition=True), NOW)
    assert patch == {
        "status": {
            "conditions": [
                {
                    "type": "infergrid.io/GPUHealthy",
                    "status": "False",
                    "reason": "GPUUnhealthy",
                    "message": BROKEN_1.message,
                    "lastTransitionTime": "2026-03-04T05:06:07Z",
                }
            ]
        }
    }
    reworded = condition_patch(ConditionChange(holder, BROKEN_1, transition=False), NOW)
    assert "lastTransitionTime" not in reworded["status"]["conditions"][0]


def test_the_warning_event_names_the_pod_the_gpu_and_the_device_plugin():
    holder = pod("p", "n", whole("c", "GPU-1"))
    event = warning_event(ConditionChange(holder, BROKEN_1, transition=True), "n", NOW)
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "default",
        "name": "p",
        "uid": "uid-p",
    }
    assert (event["type"], event["reason"], event["message"]) == (
        "Warning",
        "GPUUnhealthy",
        BROKEN_1.message,
    )
    assert event["metadata"] == {"generateName": "p.", "namespace": "default"}
    assert event["source"] == {"component": "infergrid-device-plugin", "host": "n"}
    assert (event["reportingComponent"], event["reportingInstance"]) == (
        "infergrid-device-plugin",
        "n",
    )
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-03-04T05:06:07Z"


# The reporter's rounds.


@dataclass
class FakeConditions:
    """The node's pods as the API server keeps them; ``down`` makes every call fail."""

    pods: dict[str, ObservedPod] = field(default_factory=dict)
    down: bool = False
    lists: int = 0
    written: list[ConditionChange] = field(default_factory=list)
    changed: threading.Event = field(default_factory=threading.Event)

    def add(self, record: PodRecord, condition: GpuCondition | None = None) -> None:
        self.pods[record.uid] = ObservedPod(record, condition)

    def gpu_conditions(self) -> list[ObservedPod] | None:
        self.lists += 1
        return None if self.down else list(self.pods.values())

    def set_gpu_condition(self, change: ConditionChange) -> bool:
        if self.down:
            return False
        self.pods[change.pod.uid] = ObservedPod(change.pod, change.condition)
        self.written.append(change)
        self.changed.set()
        return True

    def condition(self, uid: str) -> GpuCondition | None:
        return self.pods[uid].condition


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


INVENTORY = GpuInventory(
    "n", tuple(Gpu(u, i, "NVIDIA L4", 23034, 58, "8.9", 0, True) for u, i in INDICES.items())
)


def reporter_of(tracker: HealthTracker, pods: FakeConditions, stop=None) -> PodHealthReporter:
    return PodHealthReporter(tracker, pods, lambda: INVENTORY, 60, stop or threading.Event())


def test_a_healthy_node_lists_its_pods_once_then_never_while_all_stays_healthy():
    pods, tracker = FakeConditions(), HealthTracker(30)
    pods.add(pod("p", "n", whole("c", "GPU-1")))
    reporter = reporter_of(tracker, pods)
    for _ in range(3):
        reporter.report_once()
    assert (pods.lists, pods.written) == (1, [])


def test_a_restarted_plugin_turns_back_a_condition_left_from_before():
    pods = FakeConditions()
    pods.add(pod("p", "n", whole("c", "GPU-1")), BROKEN_1)
    reporter_of(HealthTracker(30), pods).report_once()
    assert pods.condition("uid-p").status == "True"


def test_a_fault_is_reported_once_kept_while_it_lasts_and_turned_back_when_it_passes():
    clock = FakeClock()
    tracker, pods = HealthTracker(30, clock=clock), FakeConditions()
    pods.add(pod("p", "n", whole("c", "GPU-1")))
    pods.add(pod("q", "n", share("c", "GPU-0", 1024)))
    reporter = reporter_of(tracker, pods)
    tracker.record_xid("GPU-1", 32)
    reporter.report_once()
    reporter.report_once()
    assert [(c.pod.name, c.condition.status, c.warns) for c in pods.written] == [
        ("p", "False", True)
    ]
    clock.now += 30
    reporter.report_once()
    reporter.report_once()
    assert [(c.pod.name, c.condition.status) for c in pods.written[1:]] == [("p", "True")]
    assert pods.condition("uid-q") is None
    lists = pods.lists
    reporter.report_once()
    assert pods.lists == lists  # settled: nothing to list until a GPU turns unhealthy again


def test_a_pod_bound_later_to_a_gpu_still_unhealthy_is_told_too():
    tracker, pods = HealthTracker(30), FakeConditions()
    reporter = reporter_of(tracker, pods)
    tracker.record_xid("GPU-1", 48)
    reporter.report_once()
    pods.add(pod("late", "n", whole("c", "GPU-1")))
    reporter.report_once()
    assert pods.condition("uid-late").status == "False"


def test_an_api_server_that_does_not_answer_is_tried_again_next_round():
    tracker, pods = HealthTracker(30), FakeConditions(down=True)
    pods.add(pod("p", "n", whole("c", "GPU-1")), BROKEN_1)
    reporter = reporter_of(tracker, pods)
    reporter.report_once()  # the GPU is healthy: turning the condition back fails
    pods.down = False
    reporter.report_once()
    assert pods.condition("uid-p").status == "True"


def test_the_reporter_thread_reports_a_fault_at_once_and_stops_promptly():
    tracker, pods, stop = HealthTracker(60), FakeConditions(), threading.Event()
    pods.add(pod("p", "n", whole("c", "GPU-2")))
    thread = threading.Thread(target=reporter_of(tracker, pods, stop).run)
    thread.start()
    tracker.record_xid("GPU-2", 79)
    assert pods.changed.wait(10)
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert pods.condition("uid-p").message == "GPU GPU-2 (index 2) is unhealthy: " + LOST


def test_the_reporter_thread_survives_a_failing_round(caplog):
    tracker, stop = HealthTracker(60), threading.Event()

    class Broken(FakeConditions):
        def gpu_conditions(self):
            stop.set()
            raise RuntimeError("bug")

    thread = threading.Thread(target=reporter_of(tracker, Broken(), stop).run)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert "marking the pods of unhealthy GPUs failed" in caplog.text
