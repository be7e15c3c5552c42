"""The plugin's API server calls: each has a deadline, and one that fails refuses Allocate."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
from kubernetes.client.rest import ApiException
from urllib3.exceptions import MaxRetryError, ReadTimeoutError

from device_plugin.allocator import AllocationError, Grant
from device_plugin.kube import API_TIMEOUT_S, KubePods, patch_node
from device_plugin.ledger import Pending
from device_plugin.pod_health import ConditionChange, GpuCondition
from tests.device_plugin.conftest import pod, whole

POD = {
    "metadata": {"uid": "u1", "namespace": "team", "name": "p", "annotations": {}},
    "spec": {"nodeName": "n", "schedulerName": "infergrid-scheduler"},
    "status": {"phase": "Pending"},
}


class FakeCore:
    """The CoreV1Api calls the plugin makes; each answers ``answer`` or raises ``error``."""

    def __init__(self, answer: object = None, error: Exception | None = None) -> None:
        self.answer = answer
        self.error = error
        self.timeouts: list[object] = []
        self.sent: list[tuple] = []

    def _call(self, kwargs: dict) -> object:
        self.timeouts.append(kwargs.get("_request_timeout"))
        if self.error is not None:
            raise self.error
        return self.answer

    def list_pod_for_all_namespaces(self, **kwargs):
        return self._call(kwargs)

    def read_namespaced_pod(self, name, namespace, **kwargs):
        return self._call(kwargs)

    def patch_namespaced_pod(self, name, namespace, body, **kwargs):
        return self._call(kwargs)

    def patch_node(self, name, body, **kwargs):
        return self._call(kwargs)

    def patch_node_status(self, name, body, **kwargs):
        self.sent.append(("node-status", "", name, body, kwargs.get("_content_type")))
        return self._call(kwargs)

    def patch_namespaced_pod_status(self, name, namespace, body, **kwargs):
        self.sent.append(("status", namespace, name, body, kwargs.get("_content_type")))
        return self._call(kwargs)

    def create_namespaced_event(self, namespace, body, **kwargs):
        self.sent.append(("event", namespace, body["involvedObject"]["name"], body, None))
        return self._call(kwargs)


def listing(*pods: dict) -> SimpleNamespace:
    return SimpleNamespace(data=json.dumps({"items": list(pods)}).encode())


def timed_out() -> ReadTimeoutError:
    return ReadTimeoutError(None, "/api/v1/pods", "Read timed out. (read timeout=10.0)")


def test_the_node_pods_are_listed_with_a_deadline():
    core = FakeCore(listing(POD))
    assert [p.key for p in KubePods(core, "n").pods()] == ["team/p"]
    assert core.timeouts == [API_TIMEOUT_S]


@pytest.mark.parametrize(
    "error",
    [
        timed_out(),
        MaxRetryError(None, "/api/v1/pods", "connection refused"),
        ApiException(status=503, reason="Service Unavailable"),
        ConnectionResetError("reset by peer"),
    ],
    ids=["read timeout", "unreachable", "503", "reset"],
)
def test_an_api_server_that_does_not_answer_refuses_allocate(error):
    with pytest.raises(AllocationError) as refused:
        KubePods(FakeCore(error=error), "n").pods()
    message = str(refused.value)
    assert "the API server did not list the pods of node n" in message
    assert type(error).__name__ in message and "no GPU is granted unchecked" in message


def test_an_answer_that_is_not_a_pod_list_refuses_allocate():
    core = FakeCore(SimpleNamespace(data=b"<html>proxy error</html>"))
    with pytest.raises(AllocationError, match="the API server did not list the pods"):
        KubePods(core, "n").pods()


def test_a_mark_that_times_out_is_logged_and_every_call_has_a_deadline(caplog):
    record = pod("p", "n", whole("c", "GPU-0"))
    core = FakeCore(error=timed_out())
    with caplog.at_level(logging.ERROR):
        KubePods(core, "n").mark_allocated(
            [Grant(Pending(record, record.assignment.containers[0], 0), {})]
        )
    assert "could not mark default/p/c allocated" in caplog.text
    assert core.timeouts == [API_TIMEOUT_S]


def test_node_patches_have_a_deadline():
    core = FakeCore()
    patch_node(core, "n", {"a": "1"}, {})
    assert core.timeouts == [API_TIMEOUT_S]


# The GPUHealthy condition and its event.

UNHEALTHY = GpuCondition("False", "GPUUnhealthy", "GPU GPU-0 (index 0) is unhealthy: XID 79")
HEALTHY = GpuCondition("True", "GPUHealthy", "every GPU it holds is healthy: GPU-0 (index 0)")


def on_gpu(**status) -> dict:
    return POD | {"status": {"phase": "Running"} | status}


def test_the_node_pods_are_read_with_their_condition_and_finished_pods_left_out():
    condition = {"type": "infergrid.io/GPUHealthy"} | {
        "status": "False", "reason": "GPUUnhealthy", "message": UNHEALTHY.message
    }  # fmt: skip
    done = POD | {"metadata": POD["metadata"] | {"uid": "u2"}, "status": {"phase": "Succeeded"}}
    core = FakeCore(listing(on_gpu(conditions=[condition]), done))
    (observed,) = KubePods(core, "n").gpu_conditions()
    assert (observed.pod.key, observed.condition) == ("team/p", UNHEALTHY)
    assert core.timeouts == [API_TIMEOUT_S]


def test_pods_that_cannot_be_listed_are_logged_and_tried_next_round(caplog):
    with caplog.at_level(logging.WARNING):
        assert KubePods(FakeCore(error=timed_out()), "n").gpu_conditions() is None
    assert "cannot list node n's pods to mark those on unhealthy GPUs" in caplog.text


def test_a_pod_told_of_a_fault_gets_its_condition_merged_and_one_warning_event():
    core = FakeCore()
    record = pod("p", "n", whole("c", "GPU-0"))
    assert KubePods(core, "n").set_gpu_condition(ConditionChange(record, UNHEALTHY, True))
    (status, event) = core.sent
    assert status[:3] == ("status", "default", "p")
    assert status[3]["status"]["conditions"][0]["status"] == "False"
    assert status[4] == "application/strategic-merge-patch+json"
    assert event[:3] == ("event", "default", "p")
    assert (event[3]["type"], event[3]["reason"]) == ("Warning", "GPUUnhealthy")
    assert core.timeouts == [API_TIMEOUT_S, API_TIMEOUT_S]


@pytest.mark.parametrize(
    ("condition", "transition"), [(HEALTHY, True), (UNHEALTHY, False)], ids=["healed", "reworded"]
)
def test_a_condition_that_does_not_newly_warn_gets_no_event(condition, transition):
    core = FakeCore()
    record = pod("p", "n", whole("c", "GPU-0"))
    assert KubePods(core, "n").set_gpu_condition(ConditionChange(record, condition, transition))
    assert [kind for kind, *_ in core.sent] == ["status"]


@pytest.mark.parametrize(
    "error", [ApiException(status=404, reason="Not Found"), timed_out()], ids=["gone", "timeout"]
)
def test_a_condition_not_taken_is_logged_with_no_event_and_reported_not_written(error, caplog):
    core = FakeCore(error=error)
    record = pod("p", "n", whole("c", "GPU-0"))
    with caplog.at_level(logging.WARNING):
        written = KubePods(core, "n").set_gpu_condition(ConditionChange(record, UNHEALTHY, True))
    assert not written
    assert [kind for kind, *_ in core.sent] == ["status"]
    assert "could not set infergrid.io/GPUHealthy=False on default/p" in caplog.text


def test_an_event_not_taken_is_logged_and_the_condition_still_counts(caplog):
    class NoEvents(FakeCore):
        def create_namespaced_event(self, namespace, body, **kwargs):
            raise ApiException(status=403, reason="Forbidden")

    record = pod("p", "n", whole("c", "GPU-0"))
    with caplog.at_level(logging.WARNING):
        assert KubePods(NoEvents(), "n").set_gpu_condition(ConditionChange(record, UNHEALTHY, True))
    assert "event GPUUnhealthy on default/p not recorded" in caplog.text
