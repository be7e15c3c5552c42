"""Bind places the pod the API server holds, never a body a caller sent; it never binds a pod
twice; and a failed bind removes only the annotation it wrote itself."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

from kubernetes import client
from kubernetes.client.rest import ApiException

from infergrid.assignment_annotation import decode_assignment
from infergrid.constants import ANNOTATION_GPU_ASSIGNMENT
from scheduler_extender.binder import ASSIGNMENT_POINTER, Binder, unannotate_patch
from scheduler_extender.pending_binds import BindBarrier
from tests.scheduler_extender.test_http import NOW, call, service
from tests.scheduler_extender.test_pending_binds import gpu_pod

BIND_A = {"PodName": "a", "PodNamespace": "default", "PodUID": "uid-a", "Node": "h100"}


class ApiServer:
    """The API server across the seam, as far as bind uses it: pods with a resourceVersion,
    merge patches with it as a precondition, JSON patches with `test` ops, and Bindings that
    set spec.nodeName. `before_binding_fails`, when set, runs and then the Binding fails."""

    def __init__(self, *pods: dict) -> None:
        self.pods = {pod["metadata"]["name"]: copy.deepcopy(pod) for pod in pods}
        self.patches: list[object] = []
        self.bindings: list[tuple[str, str]] = []
        self.before_binding_fails = None

    def read_namespaced_pod(self, name, namespace, **_):
        if name not in self.pods:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=json.dumps(self.pods[name]).encode())

    def patch_namespaced_pod(self, name, namespace, body, **_):
        self.patches.append(copy.deepcopy(body))
        meta = self.pods[name]["metadata"]
        annotations = meta.setdefault("annotations", {})
        if isinstance(body, list):
            self._json_patch(annotations, body)
        else:
            if body["metadata"].get("resourceVersion") not in (None, meta["resourceVersion"]):
                raise ApiException(status=409, reason="Conflict")
            annotations.update(body["metadata"]["annotations"])
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    @staticmethod
    def _json_patch(annotations: dict, ops: list[dict]) -> None:
        for op in ops:
            key = op["path"].removeprefix("/metadata/annotations/")
            key = key.replace("~1", "/").replace("~0", "~")
            if op["op"] == "test" and annotations.get(key) != op["value"]:
                raise ApiException(status=422, reason="Unprocessable Entity")
            if op["op"] == "remove":
                del annotations[key]

    def create_namespaced_pod_binding(self, name, namespace, body, **_):
        if self.before_binding_fails is not None:
            self.before_binding_fails(self)
            raise ApiException(status=500, reason="Internal Server Error")
        self.pods[name].setdefault("spec", {})["nodeName"] = body["target"]["name"]
        self.bindings.append((name, body["target"]["name"]))

    def assignment(self, name: str) -> str | None:
        return self.pods[name]["metadata"].get("annotations", {}).get(ANNOTATION_GPU_ASSIGNMENT)


def extender(api: ApiServer, filtered: dict | None = None):
    """The test_http service (the sample fleet, idle) over `api`; `filtered` is the body
    kube-scheduler sent to /filter for pod a."""
    svc = service()
    svc.barrier = BindBarrier(60)
    svc.binder = Binder(api, svc.view, "binpack", clock=lambda: NOW, decided=svc.barrier.decided)
    if filtered is not None:
        svc.barrier.passed_filter("uid-a", filtered)
    return svc


def gpus_of(annotation: str) -> int:
    return sum(len(c.gpus) for c in decode_assignment(annotation).containers)


# --- a pod is bound once -----------------------------------------------------------------------


def test_a_second_bind_of_a_bound_pod_is_refused_and_changes_nothing():
    api = ApiServer(gpu_pod("a", 1))
    svc = extender(api)
    assert call(svc, "/bind", BIND_A)[1] == {"Error": ""}
    pods, patches = copy.deepcopy(api.pods), len(api.patches)

    svc.barrier.passed_filter("uid-a", gpu_pod("a", 1))  # a replayed /filter, then /bind
    _, again = call(svc, "/bind", BIND_A)

    assert again["Error"] == "pod default/a is already bound to node h100"
    assert api.pods == pods and len(api.patches) == patches and api.bindings == [("a", "h100")]
    assert svc.view.cache.reserved("uid-a")  # the GPUs the first bind took stay taken


def test_a_pod_bound_by_someone_else_is_refused_and_the_early_reservation_released():
    bound = gpu_pod("a", 2)
    bound["spec"]["nodeName"] = "a100-0"
    api = ApiServer(bound)
    svc = extender(api, filtered=gpu_pod("a", 2))

    _, result = call(svc, "/bind", BIND_A)

    assert result["Error"] == "pod default/a is already bound to node a100-0"
    assert api.patches == [] and api.bindings == []
    assert not svc.view.cache.reserved("uid-a")
    _, free = call(svc, "/filter", {"Pod": gpu_pod("b", 2), "NodeNames": ["h100"]})
    assert free["NodeNames"] == ["h100"]  # h100's two GPUs are free again


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
    assert api.patches == [] and not svc.view.cache.reserved("uid-a")


# --- a failed Binding --------------------------------------------------------------------------


def failing_binding(rewrite: str | None = None) -> ApiServer:
    """Pod a, whose Binding fails; first another bind writes `rewrite`, if given."""
    api = ApiServer(gpu_pod("a", 1))

    def fail(server: ApiServer) -> None:
        if rewrite is not None:
            server.pods["a"]["metadata"]["annotations"][ANNOTATION_GPU_ASSIGNMENT] = rewrite

    api.before_binding_fails = fail
    return api


def test_a_failed_binding_removes_the_annotation_it_wrote():
    api = failing_binding()
    _, result = call(extender(api), "/bind", BIND_A)
    assert result["Error"].startswith("could not bind")
    assert api.assignment("a") is None
    written = api.patches[0]["metadata"]["annotations"][ANNOTATION_GPU_ASSIGNMENT]
    assert api.patches[1] == unannotate_patch(written)


def test_an_annotation_rewritten_by_another_bind_is_not_removed_by_the_failing_one():
    api = failing_binding(rewrite="written by another bind")
    _, result = call(extender(api), "/bind", BIND_A)
    assert result["Error"].startswith("could not bind")
    assert api.assignment("a") == "written by another bind"


def test_the_removal_tests_the_escaped_annotation_path_then_removes_it():
    assert ASSIGNMENT_POINTER == "/metadata/annotations/infergrid.io~1gpu-assignment"
    assert [op["op"] for op in unannotate_patch("v")] == ["test", "remove"]


def test_the_kubernetes_client_sends_the_removal_as_a_json_patch():
    sent = {}

    class Wire:
        def request(self, method, url, body=None, headers=None, **_):
            sent.update(method=method, body=json.loads(body), type=headers["Content-Type"])
            return SimpleNamespace(status=200, reason="OK", data=b"{}", headers={})

    api = client.ApiClient(client.Configuration(host="http://api.invalid"))
    api.rest_client.pool_manager = Wire()
    body = unannotate_patch("v")
    client.CoreV1Api(api).patch_namespaced_pod("a", "default", body, _preload_content=False)
    assert sent == {"method": "PATCH", "body": body, "type": "application/json-patch+json"}
