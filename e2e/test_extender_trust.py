"""The extender's side of the GPU trust model (issue 18), against a real API server: a bound
pod is never bound again, and kube-scheduler's token is minted, short-lived, for its own
ServiceAccount."""

from __future__ import annotations

import copy
import json
import urllib.request
import uuid
from pathlib import Path

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from e2e.cluster.processes import wait_until
from e2e.extender_support import bound, idle_nodes, share_pod
from infergrid import constants
from scheduler_extender.scheduler_token import SchedulerToken

pytestmark = pytest.mark.e2e

GPUS = {"model": "NVIDIA A10", "count": 1, "memoryMiB": 24576, "smCount": 72,
        "computeCapability": "8.6"}  # fmt: skip


def post(port: int, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read())


def settled(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    status = core.read_namespaced_pod(name, namespace).status
    ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])
    return status.phase == "Running" and ready


def test_a_second_bind_of_a_bound_pod_is_refused_and_changes_nothing(cluster, namespace, extender):
    core = client.CoreV1Api(cluster.api)
    entries = [{"name": f"trust{i}-{uuid.uuid4().hex[:6]}", "gpus": GPUS} for i in range(2)]
    with idle_nodes(cluster.api, entries) as (first, other):
        core.create_namespaced_pod(namespace, share_pod("once", 4096, node=first))
        wait_until(lambda: bound(core, namespace, ["once"]), 60, "the pod bound")
        # KWOK writes the pod's status after the bind: compare only once it has settled.
        wait_until(lambda: settled(core, namespace, "once"), 60, "the pod Running and Ready")
        before = core.read_namespaced_pod("once", namespace)

        answer = post(extender.port, "/bind", {
            "PodName": "once", "PodNamespace": namespace, "PodUID": before.metadata.uid,
            "Node": other,
        })  # fmt: skip

        assert answer["Error"] == f"pod {namespace}/once is already bound to node {first}"
        after = core.read_namespaced_pod("once", namespace)
        assert after.metadata.resource_version == before.metadata.resource_version
        assert after.spec.node_name == first
        annotation = constants.ANNOTATION_GPU_ASSIGNMENT
        assert after.metadata.annotations[annotation] == before.metadata.annotations[annotation]


def test_a_pod_is_bound_and_assigned_in_one_write(cluster, namespace, extender):
    """The extender's Binding carries the assignment, so no version of the pod the API server
    stores has one without the other: a pod is never seen assigned but unbound."""
    core = client.CoreV1Api(cluster.api)
    entries = [{"name": f"one-{uuid.uuid4().hex[:6]}", "gpus": GPUS}]
    with idle_nodes(cluster.api, entries) as (node,):
        created = core.create_namespaced_pod(namespace, share_pod("one", 4096, node=node))
        wait_until(lambda: bound(core, namespace, ["one"]), 60, "the pod bound")
        events = watch.Watch().stream(
            core.list_namespaced_pod, namespace,
            resource_version=created.metadata.resource_version, timeout_seconds=3,
        )  # fmt: skip
        versions = [e["object"] for e in events if e["object"].metadata.name == "one"]
    annotation = constants.ANNOTATION_GPU_ASSIGNMENT
    seen = [
        (bool(v.spec.node_name), annotation in (v.metadata.annotations or {})) for v in versions
    ]
    assert (True, True) in seen and (False, True) not in seen, seen


@pytest.fixture()
def scheduler_account(cluster, namespace) -> str:
    """A kube-scheduler account of the test's own, for what the API server refuses anyone."""
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "kube-scheduler"}})
    return "kube-scheduler"


def as_token(cluster, token: str) -> client.ApiClient:
    """A client that authenticates with `token` alone (no client certificate)."""
    cfg = copy.copy(cluster.api.configuration)
    cfg.cert_file = cfg.key_file = None
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


def test_kube_schedulers_token_is_minted_for_its_account_and_authenticates_as_it(
    cluster, identities, tmp_path
):
    """The extender, as its chart ServiceAccount, mints kube-scheduler's token for the chart's
    scheduler account: the one TokenRequest its RBAC allows."""
    namespace, scheduler_account = identities.release.namespace, identities.release.sa("scheduler")
    own, shared = tmp_path / "own", tmp_path / "shared"
    own.mkdir()
    shared.mkdir()
    ca = cluster.api.configuration.ssl_ca_cert
    (own / "ca.crt").write_bytes(Path(ca).read_bytes() if ca else b"")
    minter = SchedulerToken(
        client.CoreV1Api(identities.api("extender")), scheduler_account, namespace, shared, own
    )

    token = minter.refresh()

    assert (shared / "token").read_text() == token.token
    assert (shared / "namespace").read_text() == namespace
    assert 0 < (token.expires - token.issued).total_seconds() <= 3600 + 60
    review = client.AuthenticationV1Api(as_token(cluster, token.token)).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    assert review.status.user_info.username == (
        f"system:serviceaccount:{namespace}:{scheduler_account}"
    )


def test_the_api_server_refuses_to_bind_the_token_to_a_pod_of_another_account(
    cluster, namespace, scheduler_account
):
    """Why the minted token is not bound to the extender's pod: that pod runs as the
    extender's ServiceAccount, and the API server refuses the binding."""
    core = client.CoreV1Api(cluster.api)
    pod = {  # stays Pending (no such scheduler): only its identity matters
        "metadata": {"name": "extender-like"},
        "spec": {"schedulerName": "nobody",
                 "containers": [{"name": "c", "image": "infergrid/engine"}]},
    }  # fmt: skip
    created = core.create_namespaced_pod(namespace, pod)
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": 3600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "extender-like",
                               "uid": created.metadata.uid},
        },
    }  # fmt: skip
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_service_account_token(scheduler_account, namespace, body)
    assert refused.value.status == 400
    assert "different serviceaccount name" in refused.value.body
