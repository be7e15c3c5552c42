"""Tenants of one gateway: a model name squatted by another tenant, and a gateway without keys.

The gateway runs as the chart installs it, in a pod on the real node, serving two tenants'
namespaces; its keys Secret gives each tenant a key limited to its own namespace. Each
namespace has an operator beside the test on the chart's operator ServiceAccount token, and
each tenant acts on its InferenceServices with a ServiceAccount token of its own. team-a
names its service's model like team-b's, and team-b deletes and re-creates its service:
whatever team-b's callers get meanwhile comes from team-b's engine or is a refusal, never
from team-a's, which the engines' own /metrics request counts tell apart. docs/security.md
lists the attacks.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from e2e.cluster.processes import wait_until
from e2e.gateway_support import (
    KEYS,
    engine_metrics,
    engine_pods,
    install_gateway,
    is_ready,
    sample,
    scratch_namespaces,
    wait_ready_pods,
)
from e2e.helm_release import CHART, helm, tenant_api
from e2e.real_pods import serving_namespace
from harness.engine_process import requests_seen
from infergrid.constants import CRD_GROUP, CRD_PLURAL, CRD_VERSION

pytestmark = pytest.mark.e2e

KEY_A, KEY_B = "sk-tenancy-team-a-0001", "sk-tenancy-team-b-0001"
KEY_WAKER = "sk-tenancy-waker-00001"  # team-a's too, allowed to wake one service at a time
MODEL = "minilm"  # team-b's model, and the name team-a squats
TENANT = "tenant"
# What a team gets in its own namespace: its InferenceServices.
TENANT_RULES = [{"apiGroups": [CRD_GROUP], "resources": [CRD_PLURAL],
                 "verbs": ["create", "get", "list", "delete"]}]  # fmt: skip


@dataclass(frozen=True)
class Tenancy:
    core: client.CoreV1Api  # the admin's: only to watch what happens
    team_a: str
    team_b: str
    a_services: client.CustomObjectsApi  # team-a's own token
    b_services: client.CustomObjectsApi  # team-b's own token
    url: str  # the gateway pod's API port, from this machine


def keys_secret(team_a: str, team_b: str) -> dict:
    tenants = {"version": "v1", "tenants": [
        {"name": "team-a", "keys": [KEY_A], "namespaces": [team_a]},
        {"name": "team-b", "keys": [KEY_B], "namespaces": [team_b]},
        {"name": "waker", "keys": [KEY_WAKER], "namespaces": [team_a], "maxScaleFromZero": 1},
    ]}  # fmt: skip
    return {"metadata": {"name": KEYS}, "stringData": {"tenants.yaml": yaml.safe_dump(tenants)}}


def minilm(name: str) -> dict:
    """The MiniLM sample as one stable pod, its model named MODEL."""
    body = sample("embeddings-canary.yaml")
    body["metadata"] = {"name": name}
    body["spec"].pop("canary")
    body["spec"]["model"]["name"] = MODEL
    return body


def create(services: client.CustomObjectsApi, namespace: str, body: dict) -> None:
    services.create_namespaced_custom_object(CRD_GROUP, CRD_VERSION, namespace, CRD_PLURAL,
                                             body)  # fmt: skip


def asleep(name: str) -> dict:
    """A service at zero replicas whose pods, once it is scaled up, wait for a scheduler that
    does not exist: woken, it stays waking, at no cost."""
    body = minilm(name)
    body["spec"]["model"]["name"] = name
    body["spec"]["replicas"] = 0
    body["spec"]["scheduling"] = {"schedulerName": "nobody"}
    return body


def call(url: str, key: str, model: str, timeout_s: float = 300) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{url}/v1/embeddings", method="POST",
        data=json.dumps({"model": model, "input": "what the caller wants kept private"}).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def listed(url: str, key: str) -> set[str]:
    """The model names the key may use, from GET /v1/models."""
    request = urllib.request.Request(f"{url}/v1/models",
                                     headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as response:
        return {m["id"] for m in json.loads(response.read())["data"]}


def answered(core: client.CoreV1Api, namespace: str, service: str) -> float:
    """Requests the service's ready engine pods answered, from their own /metrics."""
    pods = engine_pods(core, namespace, service)
    return sum(requests_seen(engine_metrics(p)) for p in pods if is_ready(p))


@pytest.fixture(scope="module")
def tenancy(cluster, identities, infsvc_crd, extender, helm_ready,
            tmp_path_factory) -> Iterator[Tenancy]:  # fmt: skip
    if not cluster.local:
        pytest.skip("serves on the local cluster's real node")
    core = client.CoreV1Api(cluster.api)
    log = tmp_path_factory.mktemp("tenancy")
    with scratch_namespaces(core, "gwten", "team-a", "team-b") as names:
        gateway_ns, team_a, team_b = names
        yield from _staged(cluster, identities, core, gateway_ns, team_a, team_b, log)


def tenants_services(cluster, namespace: str) -> client.CustomObjectsApi:
    """The InferenceServices of `namespace` as its tenant reaches them, with its own token."""
    return client.CustomObjectsApi(tenant_api(cluster, namespace, TENANT_RULES, TENANT))


def _staged(cluster, identities, core: client.CoreV1Api, gateway_ns: str, team_a: str,
            team_b: str, log: Path) -> Iterator[Tenancy]:  # fmt: skip
    core.create_namespaced_secret(gateway_ns, keys_secret(team_a, team_b))
    release, _ = install_gateway(cluster, gateway_ns, watched=(team_a, team_b))
    try:
        with (
            serving_namespace(cluster.api, identities, "", log / "a.log", namespace=team_a),
            serving_namespace(cluster.api, identities, "", log / "b.log", namespace=team_b),
        ):
            a_services = tenants_services(cluster, team_a)
            b_services = tenants_services(cluster, team_b)
            create(b_services, team_b, minilm(MODEL))
            create(a_services, team_a, minilm("squat"))
            wait_ready_pods(core, team_b, MODEL, 1)
            wait_ready_pods(core, team_a, "squat", 1)
            (gateway,) = core.list_namespaced_pod(
                gateway_ns, label_selector=f"app.kubernetes.io/instance={release}"
            ).items
            url = f"http://{gateway.status.pod_ip}:8080"
            wait_until(lambda: call(url, KEY_B, MODEL)[0] == 200, 120,
                       "the gateway to route team-b's model")  # fmt: skip
            yield Tenancy(core, team_a, team_b, a_services, b_services, url)
    finally:
        helm(cluster, "uninstall", release, "--namespace", gateway_ns, "--wait")


def test_a_squatter_never_answers_the_victims_callers_while_its_service_is_re_created(tenancy):
    t = tenancy
    squatter_before = answered(t.core, t.team_a, "squat")
    statuses: list[int] = []
    stop = threading.Event()

    def victims_callers() -> None:
        while not stop.wait(0.2):
            for name in (MODEL, f"{t.team_b}/{MODEL}"):
                statuses.append(call(t.url, KEY_B, name)[0])

    callers = threading.Thread(target=victims_callers)
    callers.start()
    try:
        t.b_services.delete_namespaced_custom_object(CRD_GROUP, CRD_VERSION, t.team_b,
                                                     CRD_PLURAL, MODEL)  # fmt: skip
        wait_until(lambda: not engine_pods(t.core, t.team_b, MODEL), 300,
                   "team-b's engine pod gone")  # fmt: skip
        wait_until(lambda: statuses.count(404) >= 4, 120, "team-b's model unknown to its callers")
        create(t.b_services, t.team_b, minilm(MODEL))
        wait_ready_pods(t.core, t.team_b, MODEL, 1)
        seen = len(statuses)
        wait_until(lambda: statuses[seen:].count(200) >= 2, 300,
                   "team-b's callers answered by its new pod")  # fmt: skip
    finally:
        stop.set()
        callers.join(timeout=400)
    print(f"team-b's calls while its service was re-created: {dict(Counter(statuses))}")
    assert set(statuses) <= {200, 404, 503}, sorted(set(statuses))
    assert 404 in statuses and statuses[-1] == 200
    assert answered(t.core, t.team_a, "squat") == squatter_before  # none reached team-a
    assert answered(t.core, t.team_b, MODEL) >= statuses[seen:].count(200)  # its new pod


def test_a_tenants_key_reaches_only_its_own_namespace_qualified_or_not(tenancy):
    t = tenancy
    services = client.CustomObjectsApi(t.core.api_client)
    before = services.get_namespaced_custom_object(CRD_GROUP, CRD_VERSION, t.team_b,
                                                   CRD_PLURAL, MODEL)  # fmt: skip
    squatter_before = answered(t.core, t.team_a, "squat")
    victim_before = answered(t.core, t.team_b, MODEL)
    assert call(t.url, KEY_A, MODEL)[0] == 200  # team-a's own, under the name it squats
    status, refused = call(t.url, KEY_A, f"{t.team_b}/{MODEL}")
    assert (status, refused["error"]["code"]) == (404, "model_not_found")
    offered = refused["error"]["message"].partition("served: ")[2].split(", ")
    assert {MODEL, f"{t.team_a}/{MODEL}"} <= set(offered)
    assert not [n for n in offered if t.team_b in n]  # team-a's names only
    assert answered(t.core, t.team_a, "squat") == squatter_before + 1
    assert answered(t.core, t.team_b, MODEL) == victim_before
    # team-b's key reaches team-b's engine by the qualified name; nothing of team-b changed.
    assert call(t.url, KEY_B, f"{t.team_b}/{MODEL}")[0] == 200
    assert answered(t.core, t.team_b, MODEL) == victim_before + 1
    after = services.get_namespaced_custom_object(CRD_GROUP, CRD_VERSION, t.team_b,
                                                  CRD_PLURAL, MODEL)  # fmt: skip
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"] == before["spec"]


def test_a_tenant_wakes_no_more_services_from_zero_than_its_cap(tenancy):
    """The waker's first request holds one service waking; its request to a second service
    at zero is refused naming maxScaleFromZero, and that service is left as it was."""
    t = tenancy
    for name in ("sleepy-1", "sleepy-2"):
        create(t.a_services, t.team_a, asleep(name))
    services = client.CustomObjectsApi(t.core.api_client)

    def read(name: str) -> dict:
        return services.get_namespaced_custom_object(CRD_GROUP, CRD_VERSION, t.team_a,
                                                     CRD_PLURAL, name)  # fmt: skip

    wait_until(lambda: {"sleepy-1", "sleepy-2"} <= listed(t.url, KEY_WAKER), 60,
               "the gateway to route team-a's sleeping services")  # fmt: skip
    before = read("sleepy-2")

    def waking() -> None:
        """A request held for sleepy-1 until the client gives up on it."""
        try:
            call(t.url, KEY_WAKER, "sleepy-1", timeout_s=20)
        except TimeoutError:
            pass

    held = threading.Thread(target=waking)
    held.start()
    try:
        wait_until(lambda: read("sleepy-1")["spec"]["replicas"] == 1, 15,
                   "the gateway to ask for a replica of sleepy-1")  # fmt: skip
        status, refused = call(t.url, KEY_WAKER, "sleepy-2")
    finally:
        held.join()
    assert (status, refused["error"]["code"]) == (429, "scale_from_zero_limit")
    assert "maxScaleFromZero" in refused["error"]["message"]
    after = read("sleepy-2")  # its spec as it was: no replica asked for
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"]["replicas"] == 0


def test_without_keys_helm_refuses_the_install_unless_anonymous_callers_are_allowed(
    cluster, helm_ready
):
    if not cluster.local:
        pytest.skip("runs a gateway pod on the local cluster's real node")
    core = client.CoreV1Api(cluster.api)
    namespace = f"gwanon-{uuid.uuid4().hex[:4]}"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        refused = helm(cluster, "install", "nokeys", str(CHART), "--namespace", namespace,
                       "--skip-crds", "--set", "operator.enabled=false",
                       "--set", "scheduler.enabled=false", "--set", "devicePlugin.enabled=false",
                       "--set", "admissionPolicy.enabled=false",
                       "--set", "priorityClasses.create=false",
                       "--set", "gateway.apiKeysSecret.name=")  # fmt: skip
        assert refused.returncode != 0
        assert "gateway.apiKeysSecret.name is empty" in refused.stderr, refused.stderr
        assert "gateway.allowAnonymous=true" in refused.stderr
        assert core.list_namespaced_pod(namespace).items == []  # nothing was installed
        open_values = ("gateway.allowAnonymous=true", "gateway.apiKeysSecret.name=")
        release, _ = install_gateway(cluster, namespace, values=open_values)
        try:
            (pod,) = core.list_namespaced_pod(
                namespace, label_selector=f"app.kubernetes.io/instance={release}"
            ).items
            with urllib.request.urlopen(f"http://{pod.status.pod_ip}:8080/readyz",
                                        timeout=10) as response:  # fmt: skip
                status, body = response.status, json.loads(response.read())
            assert status == 200 and body["ready"] is True
            assert "unauthenticated" in body["warning"]
        finally:
            helm(cluster, "uninstall", release, "--namespace", namespace, "--wait")
    finally:
        core.delete_namespace(namespace)
