"""A gateway replica killed under load: its pod deleted (SIGTERM, its grace period) while chat
requests, whole and streamed, run through the gateway's Service.

Two gateway replicas from the chart, in front of one SmolLM2 engine pod on the real node. The
local cluster runs no kube-proxy, so the clients do what it does for them (`ServiceRouter`):
a new connection goes to an endpoint the Service's EndpointSlices list as ready, and a kept
connection stays on its pod until the pod closes it; a request that finds its kept
connection already closed (not a byte read) is sent again on a new one, as HTTP clients do,
and counted apart. What must hold:
- requests in flight on the deleted replica end with an answer, or with a status or a
  stream's error event the client can act on; never a silent cut, nor a reset;
- no request on another replica fails;
- no accepted non-streamed request is lost: answered, or refused with a status to retry;
- requests started once the pod is gone all go to another replica.
The drain is short here (`DRAIN_S`), so streams still running when it ends are cut off with
the error event. The tally is published (e2e/fault_report.py).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from e2e.cluster.processes import wait_until
from e2e.extender_support import audit
from e2e.fault_report import Tally, load_scale, publish
from e2e.gateway_support import (
    TEAM_B,
    chat_service,
    gateway_namespace,
    is_ready,
    wait_ready_pods,
)
from e2e.helm_release import helm
from e2e.operator_support import kubectl
from e2e.real_pods import serving_namespace

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

DRAIN_S = 3  # gateway.drainSeconds: short, so a stream can outlast it
CLIENTS = 4  # threads, each a client sending one request after another
BEFORE_S, AFTER_S = 8.0, 15.0  # load before the deletion, and after the pod is gone
GATEWAY_PORT = 8080
QUESTION = [{"role": "user", "content": "Count from one to one hundred."}]
WHOLE = {"model": "smollm2", "messages": QUESTION, "max_tokens": 8, "temperature": 0}
STREAM = {**WHOLE, "max_tokens": 48, "stream": True, "ignore_eos": True}
RETRYABLE = (429, 503)


@dataclass(frozen=True)
class Result:
    pod_ip: str
    streamed: bool
    outcome: str  # one of fault_report.OUTCOMES
    began: float
    ended: float
    detail: str = ""


class ServiceRouter:
    """What kube-proxy does for the Service's clients: the ready endpoints, read from its
    EndpointSlices every 0.2 s, taken in turn for each new connection."""

    def __init__(self, api: client.ApiClient, namespace: str, service: str) -> None:
        self.discovery = client.DiscoveryV1Api(api)
        self.namespace, self.selector = namespace, f"kubernetes.io/service-name={service}"
        self.ready: list[str] = []
        self.turn = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.refresh()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def refresh(self) -> None:
        slices = self.discovery.list_namespaced_endpoint_slice(
            self.namespace, label_selector=self.selector
        ).items
        ready = sorted(
            e.addresses[0] for s in slices for e in s.endpoints or []
            if e.conditions is not None and e.conditions.ready
        )  # fmt: skip
        with self.lock:
            self.ready = ready

    def _loop(self) -> None:
        while not self.stop.wait(0.2):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - keep the last list, as kube-proxy does
                pass

    def pick(self) -> str:
        with self.lock:
            assert self.ready, "the gateway Service lists no ready endpoint"
            self.turn += 1
            return self.ready[self.turn % len(self.ready)]


def classify(status: int, body: bytes, streamed: bool) -> tuple[str, str]:
    """How one answer ended, as fault_report.OUTCOMES counts it."""
    if status >= 400:
        return "refused", f"{status} {error_code(body)}"
    if not streamed:
        doc = json.loads(body)
        return ("answered", "") if doc.get("choices") else ("lost", f"no choices: {body[:120]!r}")
    events = [e[6:] for e in body.split(b"\n\n") if e.startswith(b"data: ")]
    if events and events[-1] == b"[DONE]":
        return "answered", ""
    if events and events[-1].startswith(b'{"error"'):
        return "failed_in_flight", f"error event {error_code(events[-1])}"
    return "lost", f"a stream cut without an error event after {len(events)} events"


def error_code(body: bytes) -> str:
    """The OpenAI error's code, or the body's start."""
    try:
        return str(json.loads(body)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return repr(body[:80])


class Stale(Exception):
    """A kept connection the pod closed as this request reached it (HTTP/1.1's keep-alive
    race: a broken pipe sending, a reset or a close before a byte of an answer): the
    client sends it again on a new connection, as the openai client does."""


def one_request(
    conn: http.client.HTTPConnection, streamed: bool, reused: bool
) -> tuple[str, str, bool]:
    """(outcome, detail, whether the pod closes the connection) of one chat request."""
    headers = {"Authorization": f"Bearer {TEAM_B}", "Content-Type": "application/json"}
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(STREAM if streamed else WHOLE),
                     headers)  # fmt: skip
    except OSError as err:
        if reused:
            raise Stale from err
        return "lost", f"{type(err).__name__}: {err}", True
    try:
        response = conn.getresponse()
    except (http.client.RemoteDisconnected, ConnectionResetError) as err:  # not a byte back
        if reused:
            raise Stale from err
        return "lost", f"{type(err).__name__}: {err}", True
    except (TimeoutError, OSError, http.client.HTTPException) as err:
        return "lost", f"{type(err).__name__}: {err}", True
    try:
        body = response.read()
    except (TimeoutError, OSError, http.client.HTTPException) as err:
        return "lost", f"{type(err).__name__}: {err}", True
    outcome, detail = classify(response.status, body, streamed)
    return outcome, detail, response.will_close


def client_loop(
    router: ServiceRouter, stop: threading.Event, results: list[Result], stale: Counter, n: int
) -> None:
    """One client: requests one after another, alternately whole and streamed, on a kept
    connection while its pod keeps it open."""
    conn, pod_ip, streamed, reused = None, "", n % 2 == 1, False
    while not stop.is_set():
        if conn is None:
            pod_ip, reused = router.pick(), False
            conn = http.client.HTTPConnection(pod_ip, GATEWAY_PORT, timeout=120)
            try:
                conn.connect()
            except OSError:  # refused before anything was sent: not accepted, pick again
                conn = None
                stale["refused connections"] += 1
                time.sleep(0.05)
                continue
        began = time.monotonic()
        try:
            outcome, detail, closes = one_request(conn, streamed, reused)
        except Stale:
            stale["stale kept connections"] += 1
            conn.close()
            conn = None
            continue
        reused = True
        results.append(Result(pod_ip, streamed, outcome, began, time.monotonic(), detail))
        if closes:
            conn.close()
            conn = None
        streamed = not streamed
    if conn is not None:
        conn.close()


@dataclass(frozen=True)
class Gateways:
    namespace: str
    service: str
    release: str


@pytest.fixture(scope="module")
def gateways(cluster, identities, infsvc_crd, extender, helm_ready, tmp_path_factory
             ) -> Iterator[Gateways]:  # fmt: skip
    """A namespace with the keys Secret, two chart gateway replicas, the operator, and one
    SmolLM2 pod."""
    if not cluster.local:
        pytest.skip("serves on the local cluster's real node")
    core = client.CoreV1Api(cluster.api)
    log = tmp_path_factory.mktemp("gateway-fault") / "operator.log"
    namespace, release, metrics_url = gateway_namespace(
        cluster, "gwfault", values=(f"gateway.drainSeconds={DRAIN_S}",), replicas=2
    )
    with serving_namespace(cluster.api, identities, "", log, namespace=namespace,
                           operator_args=("--gateway-metrics-url", metrics_url)):  # fmt: skip
        try:
            service = chat_service()
            service["spec"]["replicas"] = 1
            kubectl(cluster.kubeconfig, "apply", "-n", namespace, "-f", "-",
                    stdin=yaml.safe_dump(service))  # fmt: skip
            wait_ready_pods(core, namespace, "smollm2", 1)
            yield Gateways(namespace, f"{release}-infergrid-gateway", release)
        finally:
            helm(cluster, "uninstall", release, "--namespace", namespace, "--wait")


def gateway_pods(core: client.CoreV1Api, gw: Gateways) -> list[client.V1Pod]:
    selector = f"app.kubernetes.io/instance={gw.release},app.kubernetes.io/component=gateway"
    pods = core.list_namespaced_pod(gw.namespace, label_selector=selector).items
    return [p for p in pods if not p.metadata.deletion_timestamp and is_ready(p)]


def gone(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except ApiException as err:
        if err.status == 404:
            return True
        raise
    return False


def test_a_gateway_replica_deleted_under_load_loses_nothing(cluster, gateways):
    core = client.CoreV1Api(cluster.api)
    wait_until(lambda: len(gateway_pods(core, gateways)) == 2, 120, "two ready gateway pods")
    victim = gateway_pods(core, gateways)[0]
    router = ServiceRouter(cluster.api, gateways.namespace, gateways.service)
    wait_until(lambda: len(router.ready) == 2, 60, "the Service listing both gateway pods")
    stop, results, stale = threading.Event(), [], Counter()
    clients = [threading.Thread(target=client_loop, args=(router, stop, results, stale, n))
               for n in range(CLIENTS * load_scale())]  # fmt: skip
    for thread in clients:
        thread.start()
    try:
        time.sleep(BEFORE_S)
        killed_at = time.monotonic()
        core.delete_namespaced_pod(victim.metadata.name, gateways.namespace)
        grace = DRAIN_S + 30
        wait_until(lambda: gone(core, gateways.namespace, victim.metadata.name), grace,
                   f"gateway pod {victim.metadata.name} gone")  # fmt: skip
        gone_at = time.monotonic()
        time.sleep(AFTER_S)
    finally:
        stop.set()
        for thread in clients:
            thread.join(180)
        router.stop.set()

    tally = Tally(
        "gateway replica killed",
        f"{len(clients)} clients of the gateway Service, chat alternately whole and streamed",
    )
    for result in results:
        tally.count(result.outcome)
    on_victim = [r for r in results if r.pod_ip == victim.status.pod_ip]
    elsewhere = [r for r in results if r.pod_ip != victim.status.pod_ip]
    after_gone = [r for r in results if r.began > gone_at]
    in_flight = [r for r in on_victim if r.began < killed_at < r.ended]
    answered_after = [r.ended for r in results if r.began > killed_at and r.outcome == "answered"]
    tally.recovery_s = round(min(answered_after) - killed_at, 2) if answered_after else None
    endings = Counter(f"{r.outcome} ({r.detail})" for r in results if r.detail)
    tally.seen = "; ".join([
        f"{len(in_flight)} requests in flight on the deleted replica",
        f"{sum(r.began > killed_at for r in on_victim)} sent to it while it drained",
        f"{len(elsewhere)} on the other replicas",
        f"resent on a new connection: {dict(stale) or 'none'}",
        *(f"{n} {ending}" for ending, n in endings.most_common(5)),
    ])  # fmt: skip
    publish(tally)

    lost = [r for r in results if r.outcome == "lost"]
    assert not lost, lost[:5]
    assert in_flight, "no request was in flight on the deleted replica: the fault tried nothing"
    assert all(r.outcome == "answered" for r in elsewhere), [
        r for r in elsewhere if r.outcome != "answered"
    ][:5]
    for r in on_victim:
        if not r.streamed:
            assert r.outcome == "answered" or (
                r.outcome == "refused" and int(r.detail.split()[0]) in RETRYABLE
            ), r
    assert after_gone, "no request started once the pod was gone"
    assert all(r.pod_ip != victim.status.pod_ip for r in after_gone)
    audit(core)
