"""Attacks on the gateway through the chart install: a tenant's backend that redirects, a
forged EndpointSlice, a deleted keys Secret, a flood of bad keys, an engine that never
answers.

The gateway runs as the chart installs it, in a pod on the real node, with its own
ServiceAccount; the operator runs beside the test on the chart's operator ServiceAccount
token, serving the tenant's namespace. The tenant holds a ServiceAccount of its own with
what a team gets in its namespace (pods, Services, EndpointSlices, InferenceServices) and
does everything with that token. Its backends are its own pods, a tiny Python HTTP server in
the gateway image, carrying its InferenceService's labels (and named as that service's
Deployment names its pods), so the endpoint controller lists them in the operator's Service:
no engine, no GPU. Its InferenceServices name a scheduler that does not exist, so no engine
pod ever starts for them. Another namespace holds the "recorder", the stand-in for what an
attacker points the gateway at (the cloud's metadata address, another tenant's engine, an
in-cluster service): it logs every request it gets, and every attack must leave it with none.
docs/security.md lists the attacks.
"""

from __future__ import annotations

import json
import random
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from e2e.cluster.node_images import image_ref
from e2e.cluster.processes import wait_until
from e2e.gateway_support import KEYS, install_gateway, is_ready, scratch_namespaces
from e2e.helm_release import helm, tenant_api
from e2e.operator_support import events, read_service
from e2e.real_pods import REAL_NODE_LABEL, port_forward, serving_namespace, wait_phase
from inference_operator.render import pod_labels
from infergrid.constants import CRD_GROUP, CRD_PLURAL, CRD_VERSION
from infergrid.tracks import SAFE_ALPHABET, STABLE

pytestmark = pytest.mark.e2e

CALLER = "sk-attack-caller-00001"  # may call the tenant's namespace
OTHER = "sk-attack-other-000001"  # may call every namespace the gateway serves
BAD_KEY = "sk-attack-wrong-000001"
UPSTREAM_TIMEOUT_S = 4  # how long the gateway waits for an engine's answer
HOLD_TIMEOUT_S = 8  # how long a request waits for a service with no ready pod
FAILURES_BURST = 10  # gateway/failed_keys.py: 401s an address gets before 429s
PYTHON = "/opt/infergrid/bin/python"  # the gateway image's
POD_HASH = "7c9d8f6b5"  # a ReplicaSet hash, as the operator's Deployment would name its pods

STANDIN = r"""
import json, os, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROLE, TARGET, MARKER = os.environ["ROLE"], os.environ.get("TARGET", ""), os.environ["MARKER"]
REDIRECTS = {"/v1/embeddings": 307, "/v1/completions": 303}

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.answer()

    def do_POST(self):
        self.answer()

    def answer(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        print("HIT", self.command, self.path, self.client_address[0], flush=True)
        if ROLE == "sleeper" and self.command == "POST":
            time.sleep(3600)
        if ROLE == "redirect":
            self.reply(REDIRECTS.get(self.path, 302), b"", {"Location": TARGET + self.path})
        elif ROLE == "garbage" and self.path == "/metrics":
            self.reply(200, (MARKER + " is no Prometheus text\n").encode(), {})
        elif self.path == "/metrics":
            self.reply(200, b"", {"Content-Type": "text/plain"})
        else:
            body = {"object": "list", "model": ROLE, "served_by": MARKER,
                    "data": [{"object": "embedding", "index": 0, "embedding": [0.5]}],
                    "usage": {"prompt_tokens": 1, "total_tokens": 1}}
            self.reply(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def reply(self, status, body, headers):
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("", 8000), Handler).serve_forever()
"""

# What a team gets in its own namespace: enough to run its own servers behind its own
# InferenceServices, and to write EndpointSlices (which some clusters grant for Services
# without selectors).
TENANT = "tenant"
TENANT_RULES = [
    {"apiGroups": [""], "resources": ["pods", "services"],
     "verbs": ["create", "get", "list", "delete"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
     "verbs": ["create", "get", "list", "delete"]},
    {"apiGroups": [CRD_GROUP], "resources": [CRD_PLURAL],
     "verbs": ["create", "get", "list", "delete"]},
]  # fmt: skip


@dataclass(frozen=True)
class Hit:
    method: str
    path: str
    source: str


@dataclass(frozen=True)
class Stage:
    core: client.CoreV1Api  # the admin's: only to watch what happens
    tenant: client.ApiClient  # the tenant's token
    namespace: str  # the tenant's, served by the gateway and the operator
    gateway_namespace: str
    gateway_ip: str
    url: str  # the gateway's Service, through kubectl port-forward
    direct_url: str  # the gateway pod's API port, from this machine
    recorder: client.V1Pod
    backends: dict[str, list[str]]  # the tenant's pods, by the service they stand behind

    def hits(self, pod: str) -> list[Hit]:
        """What one of the tenant's pods was sent."""
        return hits(self.core, self.namespace, pod)

    def recorded(self) -> list[Hit]:
        """What reached the recorder, less this module's own check that it records."""
        found = hits(self.core, self.recorder.metadata.namespace, self.recorder.metadata.name)
        return [h for h in found if not h.path.startswith("/control")]


# --- helpers --------------------------------------------------------------------------


def hits(core: client.CoreV1Api, namespace: str, pod: str) -> list[Hit]:
    """The requests a stand-in server logged, in order."""
    lines = core.read_namespaced_pod_log(pod, namespace).splitlines()
    return [Hit(*line.split()[1:4]) for line in lines if line.startswith("HIT ")]


def posts(found: list[Hit]) -> int:
    """The requests among `found` that a client sent (the rest are scrapes of /metrics)."""
    return sum(h.method == "POST" for h in found)


def standin_pod(name: str, role: str, marker: str, target: str = "",
                labels: dict[str, str] | None = None) -> dict:  # fmt: skip
    """A pod on the real node serving the STANDIN script on port 8000 (named http, the port
    the operator's Service targets), as the gateway image's non-root user."""
    env = [{"name": "ROLE", "value": role}, {"name": "MARKER", "value": marker},
           {"name": "TARGET", "value": target}]  # fmt: skip
    container = {
        "name": "server",
        "image": image_ref("gateway"),
        "command": [PYTHON, "-c", STANDIN],
        "env": env,
        "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                      "limits": {"memory": "128Mi"}},
        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
    }  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeSelector": {REAL_NODE_LABEL: "true"},
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "containers": [container],
        },
    }


def engine_like_name(service: str) -> str:
    """A name the gateway takes for one of the service's stable pods."""
    return f"{service}-{POD_HASH}-{''.join(random.choices(sorted(SAFE_ALPHABET), k=5))}"


def inference_service(name: str, autoscaled: bool = False) -> dict:
    """An InferenceService at zero replicas whose engine pods, if it is ever scaled up, wait
    for a scheduler that does not exist: its backends are the tenant's own pods."""
    spec: dict = {
        "model": {"name": name, "storageUri": "pkg://all-minilm-l6-v2",
                  "format": "safetensors", "task": "embedding"},
        "resources": {"gpuMemoryMiB": 1024, "gpuCores": 10},
        "replicas": 0,
        "scheduling": {"schedulerName": "nobody"},
    }  # fmt: skip
    if autoscaled:
        spec["autoscaling"] = {"enabled": True, "minReplicas": 0, "maxReplicas": 1,
                               "intervalSeconds": 2}  # fmt: skip
    return {"apiVersion": f"{CRD_GROUP}/{CRD_VERSION}", "kind": "InferenceService",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def keys_secret(tenant_namespace: str) -> dict:
    tenants = {"version": "v1", "tenants": [
        {"name": "caller", "keys": [CALLER], "requestsPerSecond": 50, "burst": 100,
         "namespaces": [tenant_namespace]},
        {"name": "other", "keys": [OTHER], "requestsPerSecond": 50, "burst": 100},
    ]}  # fmt: skip
    return {"metadata": {"name": KEYS}, "stringData": {"tenants.yaml": yaml.safe_dump(tenants)}}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args, **_kwargs) -> None:
        return None  # a 3xx comes back to the test as it is


OPENER = urllib.request.build_opener(_NoRedirect)


def call(url: str, path: str, key: str, body: dict | None = None) -> tuple[int, str]:
    """The status and body of one request (a POST of `body`, else a GET), redirects not
    followed."""
    request = urllib.request.Request(
        url + path, method="GET" if body is None else "POST",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with OPENER.open(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def embed(model: str) -> dict:
    return {"model": model, "input": "what the caller wants kept private"}


def restart_with_settings(core: client.CoreV1Api, namespace: str, release: str,
                          settings: dict[str, object]) -> client.V1Pod:  # fmt: skip
    """The gateway pod again, started from its ConfigMap with `settings` added: what an admin
    does for a setting the chart has no value for (the upstream timeout)."""
    name = f"{release}-infergrid-gateway"
    config = core.read_namespaced_config_map(name, namespace)
    config.data["gateway.yaml"] += "\n" + yaml.safe_dump(settings)
    core.replace_namespaced_config_map(name, namespace, config)
    selector = f"app.kubernetes.io/instance={release}"
    (old,) = core.list_namespaced_pod(namespace, label_selector=selector).items
    core.delete_namespaced_pod(old.metadata.name, namespace)

    def new_ready() -> list[client.V1Pod]:
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
        return [p for p in pods if p.metadata.uid != old.metadata.uid and is_ready(p)]

    wait_until(lambda: len(new_ready()) == 1, 180, "the gateway restarted with the settings")
    return new_ready()[0]


def wait_seen_by(stage_hits: Callable[[], list[Hit]], source: Callable[[str], bool],
                 what: str) -> None:  # fmt: skip
    """Waits for a GET /metrics from a source that `source` accepts: the gateway scrapes only
    the pods in its catalog, the operator only the pods of its services."""
    wait_until(
        lambda: any(h.method == "GET" and h.path == "/metrics" and source(h.source)
                    for h in stage_hits()),
        120, what,
    )  # fmt: skip


# --- the stage ------------------------------------------------------------------------


BACKENDS = {"redirect": 1, "garbage": 1, "echo": 1, "sleeper": 2}  # service -> its pods
AUTOSCALED = ("redirect", "garbage")  # the operator scrapes these
FORGED = "forged"  # a service with no backend of its own


@pytest.fixture(scope="module")
def stage(cluster, identities, infsvc_crd, helm_ready, tmp_path_factory) -> Iterator[Stage]:
    if not cluster.local:
        pytest.skip("serves on the local cluster's real node")
    core = client.CoreV1Api(cluster.api)
    with scratch_namespaces(core, "gwatk", "tenant", "victim") as names:
        gateway_ns, namespace, victim_ns = names
        yield from _staged(cluster, identities, core, gateway_ns, namespace, victim_ns,
                           tmp_path_factory.mktemp("attacks") / "operator.log")  # fmt: skip


def _staged(cluster, identities, core: client.CoreV1Api, gateway_ns: str, namespace: str,
            victim_ns: str, log: Path) -> Iterator[Stage]:  # fmt: skip
    recorder = _recorder(core, victim_ns)
    core.create_namespaced_secret(gateway_ns, keys_secret(namespace))
    hold = f"gateway.holdTimeoutSeconds={HOLD_TIMEOUT_S}"
    release, _ = install_gateway(cluster, gateway_ns, watched=(namespace,), values=(hold,))
    try:
        gateway = restart_with_settings(core, gateway_ns, release,
                                        {"upstreamTimeoutSeconds": UPSTREAM_TIMEOUT_S})  # fmt: skip
        gateway_ip = gateway.status.pod_ip
        operator_args = ("--gateway-metrics-url", f"http://{gateway_ip}:9090/metrics")
        with serving_namespace(cluster.api, identities, "", log, namespace=namespace,
                               operator_args=operator_args):  # fmt: skip
            tenant = tenant_api(cluster, namespace, TENANT_RULES, TENANT)
            try:
                backends = _tenant_backends(tenant, core, namespace, recorder)
                service = f"svc/{release}-infergrid-gateway"
                with port_forward(cluster.kubeconfig, gateway_ns, service, 80) as url:
                    stage = Stage(core, tenant, namespace, gateway_ns, gateway_ip, url,
                                  f"http://{gateway_ip}:8080", recorder, backends)  # fmt: skip
                    for pods in backends.values():
                        for pod in pods:
                            wait_seen_by(lambda p=pod: stage.hits(p), gateway_ip.__eq__,
                                         f"the gateway to scrape {pod}")  # fmt: skip
                    yield stage
            finally:
                _delete_services(tenant, namespace)
    finally:
        helm(cluster, "uninstall", release, "--namespace", gateway_ns, "--wait")


def _recorder(core: client.CoreV1Api, namespace: str) -> client.V1Pod:
    """The recorder, checked to record: this test's own request to it is in its log."""
    name = "recorder"
    core.create_namespaced_pod(namespace, standin_pod(name, "recorder", f"recorder-{name}"))
    pod = wait_phase(core, namespace, name, "Running")
    control = f"/control-{uuid.uuid4().hex[:6]}"

    def recorded() -> bool:
        urllib.request.urlopen(f"http://{pod.status.pod_ip}:8000{control}", timeout=5).read()
        return any(h.path == control for h in hits(core, namespace, name))

    wait_until(recorded, 60, "the recorder to log a request")
    return pod


def _tenant_backends(tenant: client.ApiClient, core: client.CoreV1Api, namespace: str,
                     recorder: client.V1Pod) -> dict[str, list[str]]:  # fmt: skip
    """The tenant's InferenceServices, and its pods behind them; returns the pods' names."""
    custom, pods = client.CustomObjectsApi(tenant), client.CoreV1Api(tenant)
    for name in (*BACKENDS, FORGED):
        body = inference_service(name, autoscaled=name in AUTOSCALED)
        custom.create_namespaced_custom_object(CRD_GROUP, CRD_VERSION, namespace, CRD_PLURAL, body)
    target = f"http://{recorder.status.pod_ip}:8000/via-redirect"
    made: dict[str, list[str]] = {}
    for service, count in BACKENDS.items():
        made[service] = [engine_like_name(service) for _ in range(count)]
        for pod in made[service]:
            body = standin_pod(pod, service, f"tenant-{pod}", target, pod_labels(service, STABLE))
            pods.create_namespaced_pod(namespace, body)
    for pod in (p for names in made.values() for p in names):
        wait_phase(core, namespace, pod, "Running")
    return made


def _delete_services(tenant: client.ApiClient, namespace: str) -> None:
    """The tenant's InferenceServices deleted while the operator still runs: it removes its
    finalizer from each, which would otherwise hold the namespace in Terminating."""
    custom = client.CustomObjectsApi(tenant)
    for name in (*BACKENDS, FORGED):
        try:
            custom.delete_namespaced_custom_object(
                CRD_GROUP, CRD_VERSION, namespace, CRD_PLURAL, name
            )
        except ApiException as err:
            if err.status != 404:
                raise
    wait_until(
        lambda: not custom.list_namespaced_custom_object(
            CRD_GROUP, CRD_VERSION, namespace, CRD_PLURAL
        )["items"],
        60, "the operator to let the tenant's InferenceServices go",
    )  # fmt: skip


# --- 1: a backend that redirects -----------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/embeddings", embed("redirect")),
     ("/v1/completions", {"model": "redirect", "prompt": "hi", "max_tokens": 4})],
    ids=["307", "303"],  # what the pod answers on that path (STANDIN's REDIRECTS)
)  # fmt: skip
def test_a_backend_that_redirects_is_an_upstream_error_and_the_target_sees_nothing(
    stage, path, body
):
    (pod,) = stage.backends["redirect"]
    before = len(stage.hits(pod))
    answer, text = call(stage.url, path, CALLER, body)
    assert answer == 503, text
    assert f"{stage.namespace}/redirect" in json.loads(text)["error"]["message"]
    got = [h for h in stage.hits(pod)[before:] if h.method == "POST"]
    assert [h.path for h in got] == [path], "the gateway's request reached the pod once"
    assert stage.recorded() == []


def test_the_gateways_queue_depth_scrape_does_not_follow_a_redirect(stage):
    """The gateway reads every backend's /metrics each second; the redirecting pod answers
    302 to the recorder each time."""
    (pod,) = stage.backends["redirect"]

    def scrapes() -> list[Hit]:
        found = stage.hits(pod)
        return [h for h in found if h.source == stage.gateway_ip and h.path == "/metrics"]

    wait_until(lambda: len(scrapes()) >= 3, 60, "three scrapes by the gateway")
    assert stage.recorded() == []


def test_the_operators_scrape_does_not_follow_a_redirect(stage):
    (pod,) = stage.backends["redirect"]

    def by_operator() -> list[Hit]:
        return [h for h in stage.hits(pod) if h.source != stage.gateway_ip]

    wait_until(lambda: len(by_operator()) >= 2, 60, "two scrapes by the operator")
    assert {h.path for h in by_operator()} == {"/metrics"}
    assert stage.recorded() == []


def test_the_operators_event_about_an_unreadable_metrics_body_carries_none_of_it(stage):
    """The garbage pod's /metrics is a marker and no Prometheus text: the service's owner is
    told the pod is ignored, in the operator's words, never the body's."""
    (pod,) = stage.backends["garbage"]
    marker = f"tenant-{pod}"
    wait_until(
        lambda: any(pod in m for m in events(stage.core.api_client, stage.namespace, "garbage",
                                             "MetricsIgnored")),
        90, "a MetricsIgnored event for the garbage pod",
    )  # fmt: skip
    (message,) = events(stage.core.api_client, stage.namespace, "garbage", "MetricsIgnored")
    assert message == (f"pod {pod}: /metrics is not Prometheus text: the parser refused it "
                       "(ValueError); the autoscaler ignores its metrics")  # fmt: skip
    every = [e.message or "" for e in stage.core.list_namespaced_event(stage.namespace).items]
    assert not [m for m in every if marker in m]
    assert marker not in json.dumps(read_service(stage.core.api_client, stage.namespace,
                                                 "garbage"))  # fmt: skip


# --- 2: a forged EndpointSlice --------------------------------------------------------


def forged_slice(stage: Stage, variant: str) -> dict:
    """A slice for the FORGED service's Service pointing at the recorder, written as far as
    `variant` goes toward what the endpoint controller writes: the Service's labels (which
    the controller copies onto its slices) and the service-name label, then the controller's
    managed-by label, then the Service as its controlling owner."""
    service = client.CoreV1Api(stage.tenant).read_namespaced_service(FORGED, stage.namespace)
    labels = {**service.metadata.labels, "kubernetes.io/service-name": FORGED}
    meta: dict = {"name": f"{FORGED}-{variant}-{uuid.uuid4().hex[:5]}", "labels": labels}
    if variant in ("managed", "owned"):
        labels["endpointslice.kubernetes.io/managed-by"] = "endpointslice-controller.k8s.io"
    if variant == "owned":
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Service", "name": FORGED,
                                    "uid": service.metadata.uid, "controller": True}]  # fmt: skip
    endpoint = {
        "addresses": [stage.recorder.status.pod_ip],
        "conditions": {"ready": True},
        "targetRef": {"kind": "Pod", "name": engine_like_name(FORGED),
                      "namespace": stage.namespace},
    }  # fmt: skip
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": meta,
            "addressType": "IPv4", "endpoints": [endpoint],
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}]}  # fmt: skip


@pytest.mark.parametrize("variant", ["labelled", "managed", "owned"])
def test_a_forged_endpointslice_never_gets_a_request(stage, variant):
    """Requests for the service, held while it has no ready pod, wake on every change of the
    catalog: a slice the gateway took would be routed to at once. They must all time out."""
    discovery = client.DiscoveryV1Api(stage.tenant)
    answers: list[tuple[int, str]] = []
    senders = [threading.Thread(target=lambda: answers.append(
        call(stage.url, "/v1/embeddings", CALLER, embed(FORGED)))) for _ in range(3)]  # fmt: skip
    for sender in senders:
        sender.start()
    body = forged_slice(stage, variant)
    discovery.create_namespaced_endpoint_slice(stage.namespace, body)
    try:
        for sender in senders:
            sender.join(HOLD_TIMEOUT_S + 60)
    finally:
        try:
            discovery.delete_namespaced_endpoint_slice(body["metadata"]["name"], stage.namespace)
        except ApiException as err:
            if err.status != 404:  # the endpoint controller may have deleted it already
                raise
    assert [status for status, _ in answers] == [503] * 3, answers
    assert all("became ready" in text for _, text in answers), answers
    assert stage.recorded() == []


# --- 3: the keys Secret deleted -------------------------------------------------------


def test_a_deleted_keys_secret_refuses_every_key_until_it_is_back(stage):
    (pod,) = stage.backends["echo"]
    assert call(stage.url, "/v1/embeddings", CALLER, embed("echo"))[0] == 200
    secret = stage.core.read_namespaced_secret(KEYS, stage.gateway_namespace)
    stage.core.delete_namespaced_secret(KEYS, stage.gateway_namespace)
    try:
        wait_until(lambda: call(stage.url, "/v1/models", CALLER)[0] == 401, 60,
                   "the keys revoked")  # fmt: skip
        served = posts(stage.hits(pod))
        for key in (CALLER, OTHER):
            assert call(stage.url, "/v1/models", key)[0] == 401
            status, text = call(stage.url, "/v1/embeddings", key, embed("echo"))
            assert status == 401 and "not valid" in text, text
        assert posts(stage.hits(pod)) == served
    finally:
        stage.core.create_namespaced_secret(
            stage.gateway_namespace,
            {"metadata": {"name": KEYS}, "data": secret.data, "type": secret.type},
        )
    wait_until(lambda: call(stage.url, "/v1/models", CALLER)[0] == 200, 60, "the keys back")
    assert call(stage.url, "/v1/embeddings", CALLER, embed("echo"))[0] == 200
    assert posts(stage.hits(pod)) == served + 1


# --- 4: a flood of bad keys -----------------------------------------------------------


def test_a_burst_of_bad_keys_gets_429_after_ten_and_a_valid_key_is_still_served(stage):
    """From the gateway pod's own address, which no other test sends a bad key from: the
    address's bucket of failures is full."""
    answers = [call(stage.direct_url, "/v1/models", BAD_KEY) for _ in range(FAILURES_BURST + 1)]
    statuses = [status for status, _ in answers]
    assert statuses == [401] * FAILURES_BURST + [429], statuses
    assert "too many requests with a missing or invalid API key" in answers[-1][1]
    (pod,) = stage.backends["echo"]
    served = posts(stage.hits(pod))
    status, text = call(stage.direct_url, "/v1/embeddings", CALLER, embed("echo"))
    assert status == 200 and json.loads(text)["model"] == "echo", text
    assert posts(stage.hits(pod)) == served + 1


# --- 5: an engine that takes a request and never answers ------------------------------


def test_a_request_an_engine_took_and_never_answered_is_a_504_and_not_tried_again(stage):
    """Two pods serve the model; each takes a POST and never answers. The request reaches
    one of them, once."""
    pods = stage.backends["sleeper"]
    before = {pod: len(stage.hits(pod)) for pod in pods}
    status, text = call(stage.url, "/v1/embeddings", CALLER, embed("sleeper"))
    assert status == 504, text
    assert f"no answer from the model within {UPSTREAM_TIMEOUT_S} s" in text
    posts = [h for pod in pods for h in stage.hits(pod)[before[pod] :] if h.method == "POST"]
    assert len(posts) == 1, posts
