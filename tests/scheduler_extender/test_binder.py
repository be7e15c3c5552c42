"""Bind places the pod the API server holds, in one API call where the watch cache is up to
date; it never binds a pod twice; and a failed bind leaves the pod as it was."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

from kubernetes.client.rest import ApiException

from infergrid.assignment_annotation import decode_assignment
from infergrid.constants import ANNOTATION_GPU_ASSIGNMENT
from scheduler_extender.binder import Binder
from scheduler_extender.pending_binds import BindBarrier
from scheduler_extender.tentative import Reserver
from scheduler_extender.watch_cache import ADDED
from tests.scheduler_extender.answers import Answer
from tests.scheduler_extender.test_http import NOW, call, service
from tests.scheduler_extender.test_pending_binds import gpu_pod

BIND_A = {"PodName": "a", "PodNamespace": "default", "PodUID": "uid-a", "Node": "h100"}


class ApiServer:
    """The API server across the seam, as far as bind uses it: pods with a uid and a
    resourceVersion, and Bindings as kube-apiserver's BindingREST makes them: the Binding's
    uid and resourceVersion are preconditions (409), a bound pod is not bound again (409), and
    its annotations are copied onto the pod in the same write as spec.nodeName.
    `binding_fails`, when set, is the status every Binding is refused with."""

    def __init__(self, *pods: dict) -> None:
        self.pods = {pod["metadata"]["name"]: copy.deepcopy(pod) for pod in pods}
        self.calls: list[str] = []
        self.bindings: list[dict] = []
        self.binding_fails: int | None = None
        self.answers: list[Answer] = []

    def read_namespaced_pod(self, name, namespace, **_):
        self.calls.append("GET pod")
        if name not in self.pods:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=json.dumps(self.pods[name]).encode())

    def patch_namespaced_pod(self, name, namespace, body, **_):
        raise AssertionError("bind writes the assignment through the Binding, never a PATCH")

    def create_namespaced_pod_binding(self, name, namespace, body, **_):
        self.calls.append("POST binding")
        if self.binding_fails is not None:
            raise ApiException(status=self.binding_fails, reason="refused")
        if name not in self.pods:
            raise ApiException(status=404, reason="Not Found")
        pod, wanted = self.pods[name], body["metadata"]
        meta = pod["metadata"]
        for field in ("uid", "resourceVersion"):
            if wanted.get(field) not in (None, meta[field]):
                raise ApiException(status=409, reason=f"Conflict: {field} precondition failed")
        if pod.get("spec", {}).get("nodeName"):
            raise ApiException(status=409, reason="Conflict: already assigned")
        self.bindings.append(copy.deepcopy(body))
        meta.setdefault("annotations", {}).update(wanted.get("annotations", {}))
        pod.setdefault("spec", {})["nodeName"] = body["target"]["name"]
        self.touch(name)
        self.answers.append(Answer())
        return self.answers[-1]

    def touch(self, name: str) -> None:
        """Someone changed the pod: its resourceVersion moves."""
        meta = self.pods[name]["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def assignment(self, name: str) -> str | None:
        return self.pods[name]["metadata"].get("annotations", {}).get(ANNOTATION_GPU_ASSIGNMENT)

    def bound_to(self) -> list[tuple[str, str]]:
        return [(b["metadata"]["name"], b["target"]["name"]) for b in self.bindings]


def extender(api: ApiServer, filtered: dict | None = None, watched: bool = False):
    """The test_http service (the sample fleet, idle) over `api`; `filtered` is the body
    kube-scheduler sent to /filter for pod a; `watched`: the watch has delivered the API
    server's pods to the cache."""
    svc = service()
    svc.barrier = BindBarrier(60)
    svc.binder = Binder(api, svc.view, "binpack", clock=lambda: NOW, decided=svc.barrier.decided)
    if filtered is not None:
        svc.barrier.passed_filter("uid-a", filtered)
    if watched:
        for pod in api.pods.values():
            svc.view.cache.apply_pod(ADDED, copy.deepcopy(pod))
    return svc


def gpus_of(annotation: str) -> int:
    return sum(len(c.gpus) for c in decode_assignment(annotation).containers)


def h100_is_free(svc) -> bool:
    _, result = call(svc, "/filter", {"Pod": gpu_pod("b", 2), "NodeNames": ["h100"]})
    return result["NodeNames"] == ["h100"]


# --- one API call: the Binding carries the assignment ------------------------------------------


def test_a_watched_pod_is_bound_with_its_assignment_in_one_call():
    api = ApiServer(gpu_pod("a", 1))
    svc = extender(api, filtered=gpu_pod("a", 1), watched=True)

    assert call(svc, "/bind", BIND_A)[1] == {"Error": ""}

    assert api.calls == ["POST binding"]
    [binding] = api.bindings
    assert binding["metadata"]["uid"] == "uid-a"
    assert binding["metadata"]["resourceVersion"] == "1"  # the cache's: the pod as it was seen
    assert list(binding["metadata"]["annotations"]) == [ANNOTATION_GPU_ASSIGNMENT]
    assert api.pods["a"]["spec"]["nodeName"] == "h100" and gpus_of(api.assignment("a")) == 1


def test_the_hold_prioritize_made_is_bound_in_one_call():
    """The default: no body kept at filter, a tentative hold from prioritize instead."""
    api = ApiServer(gpu_pod("a", 1))
    svc = extender(api, watched=True)
    svc.reserver = Reserver(svc.view, "binpack", 10.0, clock=lambda: NOW)
    call(svc, "/prioritize", {"Pod": gpu_pod("a", 1), "NodeNames": ["h100"]})
    held = svc.view.cache.tentative("uid-a")
    assert held is not None

    assert call(svc, "/bind", BIND_A)[1] == {"Error": ""}

    assert api.calls == ["POST binding"]
    assert decode_assignment(api.assignment("a")) == held.assignment


def test_a_pod_changed_since_the_cache_saw_it_is_read_and_bound_at_its_new_version():
    api = ApiServer(gpu_pod("a", 1))
    svc = extender(api, filtered=gpu_pod("a", 1), watched=True)
    api.touch("a")  # e.g. kube-scheduler wrote a condition; the watch has not delivered it

    assert call(svc, "/bind", BIND_A)[1] == {"Error": ""}

    assert api.calls == ["POST binding", "GET pod", "POST binding"]
    assert api.bindings[0]["metadata"]["resourceVersion"] == "2"
    assert gpus_of(api.assignment("a")) == 1


def test_each_bindings_answer_is_read_to_its_end_so_its_connection_is_pooled_again():
    """An answer left unread keeps its connection out of the pool: each bind of a burst then
    paid a TLS handshake, on both sides."""
    api = ApiServer(gpu_pod("a", 1))
    svc = extender(api, watched=True)
    assert call(svc, "/bind", BIND_A)[1] == {"Error": ""}
    assert [(a.read_to_end, a.released) for a in api.answers] == [(True, True)]


def test_a_pod_without_a_placement_from_this_cycle_is_read_first():
    api = ApiServer(gpu_pod("a", 1))
    svc = extender(api, watched=True)  # no filtered body, no tentative hold
    assert call(svc, "/bind", BIND_A)[1] == {"Error": ""}
    assert api.calls == ["GET pod", "POST binding"]
    assert gpus_of(api.assignment("a")) == 1


def test_a_kept_body_at_another_version_than_the_cached_pod_is_not_trusted():
    # /filter saw one GPU at version 1; the pod the API server and the cache hold (version 2)
    # asks for two.
    stored = gpu_pod("a", 2)
    stored["metadata"]["resourceVersion"] = "2"
    api = ApiServer(stored)
    svc = extender(api, filtered=gpu_pod("a", 1), watched=True)

    assert call(svc, "/bind", BIND_A)[1] == {"Error": ""}

    assert api.calls == ["GET pod", "POST binding"]
    assert gpus_of(api.assignment("a")) == 2


def test_a_pod_the_cache_shows_bound_is_refused_without_a_call():
    bound = gpu_pod("a", 1)
    bound["spec"]["nodeName"] = "a100-0"
    api = ApiServer(bound)
    svc = extender(api, filtered=gpu_pod("a", 1), watched=True)

    _, result = call(svc, "/bind", BIND_A)

    assert result["Error"] == "pod default/a is already bound to node a100-0"
    assert api.calls == [] and h100_is_free(svc)


def test_a_pod_bound_since_the_cache_saw_it_is_refused_after_the_conflict():
    api = ApiServer(gpu_pod("a", 2))
    svc = extender(api, filtered=gpu_pod("a", 2), watched=True)
    api.pods["a"]["spec"]["nodeName"] = "a100-0"
    api.touch("a")

    _, result = call(svc, "/bind", BIND_A)

    assert result["Error"] == "pod default/a is already bound to node a100-0"
    assert api.calls == ["POST binding", "GET pod"] and api.bindings == []
    assert api.assignment("a") is None and h100_is_free(svc)


def test_a_pod_replaced_under_the_same_name_is_refused_after_the_conflict():
    api = ApiServer(gpu_pod("a", 1))
    svc = extender(api, filtered=gpu_pod("a", 1), watched=True)
    api.pods["a"]["metadata"]["uid"] = "uid-a-again"  # deleted and created anew

    _, result = call(svc, "/bind", BIND_A)

    assert result["Error"] == "pod default/a was replaced"
    assert api.bindings == [] and api.assignment("a") is None and h100_is_free(svc)


def test_a_second_conflict_is_refused_as_a_conflict():
    class Busy(ApiServer):
        """Every read is followed by another writer before the Binding."""

        def read_namespaced_pod(self, name, namespace, **kw):
            answer = super().read_namespaced_pod(name, namespace, **kw)
            self.touch(name)
            return answer

    api = Busy(gpu_pod("a", 1))
    svc = extender(api, filtered=gpu_pod("a", 1))

    _, result = call(svc, "/bind", BIND_A)

    assert result["Error"] == "could not bind: 409 Conflict: resourceVersion precondition failed"
    assert api.bindings == [] and h100_is_free(svc)


# --- a pod is bound once -----------------------------------------------------------------------


def test_a_second_bind_of_a_bound_pod_is_refused_and_changes_nothing():
    api = ApiServer(gpu_pod("a", 1))
    svc = extender(api)
    assert call(svc, "/bind", BIND_A)[1] == {"Error": ""}
    pods = copy.deepcopy(api.pods)

    svc.barrier.passed_filter("uid-a", gpu_pod("a", 1))  # a replayed /filter, then /bind
    _, again = call(svc, "/bind", BIND_A)

    assert again["Error"] == "pod default/a is already bound to node h100"
    assert api.pods == pods and api.bound_to() == [("a", "h100")]
    assert svc.view.cache.reserved("uid-a")  # the GPUs the first bind took stay taken


def test_a_pod_bound_by_someone_else_is_refused_and_the_early_reservation_released():
    bound = gpu_pod("a", 2)
    bound["spec"]["nodeName"] = "a100-0"
    api = ApiServer(bound)
    svc = extender(api, filtered=gpu_pod("a", 2))

    _, result = call(svc, "/bind", BIND_A)

    assert result["Error"] == "pod default/a is already bound to node a100-0"
    assert api.bindings == [] and not svc.view.cache.reserved("uid-a")
    assert h100_is_free(svc)  # h100's two GPUs are free again


def test_a_retried_bind_keeps_the_assignment_already_recorded_on_its_node():
    first = ApiServer(gpu_pod("a", 1))
    call(extender(first), "/bind", BIND_A)
    recorded = first.assignment("a")
    assigned = gpu_pod("a", 1)  # left assigned but unbound, e.g. by an older extender
    assigned["metadata"]["annotations"][ANNOTATION_GPU_ASSIGNMENT] = recorded
    api = ApiServer(assigned)

    assert call(extender(api, filtered=gpu_pod("a", 1), watched=True), "/bind", BIND_A)[1] == {
        "Error": ""
    }

    assert "annotations" not in api.bindings[0]["metadata"] and api.assignment("a") == recorded


# --- the read-back pod decides -----------------------------------------------------------------


def test_bind_places_the_read_back_request_not_the_filtered_body():
    # /filter saw one GPU under pod a's uid; the API server's pod a asks for two.
    api = ApiServer(gpu_pod("a", 2))
    svc = extender(api, filtered=gpu_pod("a", 1))

    _, result = call(svc, "/bind", BIND_A)

    assert result == {"Error": ""}
    assert gpus_of(api.assignment("a")) == 2
    _, full = call(svc, "/filter", {"Pod": gpu_pod("b", 1), "NodeNames": ["h100"]})
    assert full["NodeNames"] == []  # both of h100's GPUs are held, not one


def test_a_read_back_pod_that_no_longer_fits_is_refused_although_the_filtered_body_fit():
    api = ApiServer(gpu_pod("a", 3))  # h100 has two GPUs
    svc = extender(api, filtered=gpu_pod("a", 1))

    _, result = call(svc, "/bind", BIND_A)

    assert "no longer fits" in result["Error"]
    assert api.bindings == [] and not svc.view.cache.reserved("uid-a")


# --- a failed Binding --------------------------------------------------------------------------


def test_a_failed_binding_leaves_the_pod_as_it_was_and_its_gpus_free():
    api = ApiServer(gpu_pod("a", 2))
    api.binding_fails = 500
    svc = extender(api, filtered=gpu_pod("a", 2), watched=True)

    _, result = call(svc, "/bind", BIND_A)

    assert result["Error"].startswith("could not bind")
    assert api.calls == ["POST binding"]  # nothing written, so nothing to undo
    assert api.assignment("a") is None and not api.pods["a"]["spec"].get("nodeName")
    assert h100_is_free(svc)


def test_a_pod_gone_before_its_binding_is_refused_as_missing():
    api = ApiServer(gpu_pod("a", 1))
    svc = extender(api, filtered=gpu_pod("a", 1), watched=True)
    del api.pods["a"]
    _, result = call(svc, "/bind", BIND_A)
    assert result["Error"] == "could not bind: 404 Not Found" and h100_is_free(svc)
