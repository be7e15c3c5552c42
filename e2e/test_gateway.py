"""The gateway on the real node: one OpenAI URL for every InferenceService of a namespace.

The gateway runs as the chart installs it (a release with only the gateway on, from the
image built here), in a pod on the real node, in front of engine pods on the same node; the
operator runs beside the test, reading the gateway's pending requests. The test reaches
the gateway as a user does, through `kubectl port-forward` of its Service and the `openai`
client, and counts what the engines received from their own /metrics.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
import yaml
from kubernetes import client

from e2e.cluster.node_images import image_ref
from e2e.cluster.processes import wait_until
from e2e.helm_release import CHART, helm
from e2e.operator_support import SAMPLES, kubectl, read_service
from e2e.real_pods import port_forward, serving_namespace
from harness.engine_process import requests_seen
from infergrid.constants import LABEL_INFERENCESERVICE
from infergrid.engine_metrics import parse_engine_metrics
from infergrid.tracks import CANARY, STABLE, track_of_pod

pytestmark = pytest.mark.e2e

GATEWAY_SAMPLES = SAMPLES / "gateway"
KEYS = "infergrid-gateway-keys"
TEAM_A, TEAM_B = "sk-team-a-example-0001", "sk-team-b-example-0001"
READY_TIMEOUT = 900  # a first start unpacks the engine image; several pods load at once
CANARY_REQUESTS = 1000


def sample(name: str) -> dict:
    return yaml.safe_load((GATEWAY_SAMPLES / name).read_text())


def chat_service() -> dict:
    """The shared-GPU SmolLM2 sample with two fixed replicas, so one can die mid-stream."""
    body = yaml.safe_load((SAMPLES / "smollm2-shared.yaml").read_text())
    body["spec"]["autoscaling"] = {"enabled": False}
    body["spec"]["replicas"] = 2
    return body


class Routed:
    def __init__(self, namespace: str, url: str, metrics_url: str):
        self.namespace, self.url, self.metrics_url = namespace, url, metrics_url


def _ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def engine_pods(core: client.CoreV1Api, namespace: str, service: str) -> list[client.V1Pod]:
    selector = f"{LABEL_INFERENCESERVICE}={service}"
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in pods if not p.metadata.deletion_timestamp]


def wait_ready_pods(core, namespace: str, service: str, count: int) -> list[client.V1Pod]:
    def ready() -> list[client.V1Pod]:
        return [p for p in engine_pods(core, namespace, service) if _ready(p)]

    wait_until(lambda: len(ready()) >= count, READY_TIMEOUT, f"{count} Ready pods of {service}")
    return ready()


def install_gateway(cluster, namespace: str) -> tuple[str, str]:
    """A release of the chart with only the gateway on, serving `namespace`; returns the
    release name and the gateway pod's metrics URL (the operator reads it from the host)."""
    name = f"gw{uuid.uuid4().hex[:5]}"
    repository, tag = image_ref("gateway").removeprefix("docker.io/").rsplit(":", 1)
    done = helm(
        cluster, "install", name, str(CHART), "--namespace", namespace, "--skip-crds",
        "--set", "operator.enabled=false", "--set", "scheduler.enabled=false",
        "--set", "devicePlugin.enabled=false", "--set", "admissionPolicy.enabled=false",
        "--set", "priorityClasses.create=false",
        "--set", f"gateway.image.repository={repository}", "--set", f"gateway.image.tag={tag}",
        "--set", "gateway.replicas=1",
        "--set", f"gateway.watchNamespaces={{{namespace}}}",
        "--set", f"gateway.apiKeysSecret.name={KEYS}",
        "--set", "gateway.holdTimeoutSeconds=600",
        "--wait", "--timeout", "300s",
    )  # fmt: skip
    if done.returncode != 0:
        helm(cluster, "uninstall", name, "--namespace", namespace, "--wait")
        pytest.fail(f"helm install of the gateway: {done.stderr}")
    core = client.CoreV1Api(cluster.api)
    pods = core.list_namespaced_pod(
        namespace, label_selector=f"app.kubernetes.io/instance={name}"
    ).items
    assert len(pods) == 1 and _ready(pods[0])
    return name, f"http://{pods[0].status.pod_ip}:9090/metrics"


@pytest.fixture(scope="module")
def routed(
    cluster, identities, infsvc_crd, extender, helm_ready, tmp_path_factory
) -> Iterator[Routed]:
    """A namespace with the keys Secret, the gateway, the operator, and three services: a
    chat model (2 pods), an embedding model with a 10% canary, and one at zero replicas."""
    if not cluster.local:
        pytest.skip("serves on the local cluster's real node")
    core = client.CoreV1Api(cluster.api)
    log = tmp_path_factory.mktemp("gateway") / "operator.log"
    namespace = f"gateway-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    kubectl(cluster.kubeconfig, "apply", "-n", namespace, "-f",
            str(GATEWAY_SAMPLES / "api-keys.yaml"))  # fmt: skip
    try:
        release, metrics_url = install_gateway(cluster, namespace)
    except BaseException:
        core.delete_namespace(namespace)
        raise
    operator_args = ("--gateway-metrics-url", metrics_url)
    with serving_namespace(cluster.api, identities, "", log, namespace=namespace,
                           operator_args=operator_args):  # fmt: skip
        try:
            for body in (chat_service(), sample("embeddings-canary.yaml"),
                         sample("embeddings-scale-to-zero.yaml")):  # fmt: skip
                kubectl(cluster.kubeconfig, "apply", "-n", namespace, "-f", "-",
                        stdin=yaml.safe_dump(body))  # fmt: skip
            wait_ready_pods(core, namespace, "smollm2", 2)
            wait_ready_pods(core, namespace, "minilm", 2)
            service = f"svc/{release}-infergrid-gateway"
            with port_forward(cluster.kubeconfig, namespace, service, 80) as url:
                yield Routed(namespace, url, metrics_url)
        finally:
            helm(cluster, "uninstall", release, "--namespace", namespace, "--wait")


def ai(routed: Routed, key: str = TEAM_B) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{routed.url}/v1", api_key=key, timeout=300, max_retries=0)


def engine_counts(core, namespace: str, service: str) -> dict[str, float]:
    """Requests each track's engines answered, from the engines' own /metrics."""
    counts = {STABLE: 0.0, CANARY: 0.0}
    for pod in engine_pods(core, namespace, service):
        track = track_of_pod(service, pod.metadata.name)
        counts[track] += requests_seen(engine_metrics(pod))
    return counts


def test_two_services_answer_through_one_url_with_the_openai_client(routed):
    client_ = ai(routed)
    models = sorted(m.id for m in client_.models.list().data)
    assert models == ["minilm", "minilm-on-demand", "smollm2"]
    stream = client_.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "What is a GPU?"}],
        max_tokens=12, temperature=0, stream=True,
    )  # fmt: skip
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len([p for p in pieces if p]) >= 2
    vectors = client_.embeddings.create(model="minilm", input=["a cat", "a dog"])
    assert [len(d.embedding) for d in vectors.data] == [384, 384]


def test_an_unknown_model_is_a_404_listing_the_served_ones_and_no_key_is_a_401(routed):
    with pytest.raises(openai.NotFoundError) as missing:
        ai(routed).embeddings.create(model="gpt-5", input="x")
    assert "served: minilm, minilm-on-demand, smollm2" in str(missing.value)
    with pytest.raises(openai.AuthenticationError):
        ai(routed, key="sk-nobody-0000000000").models.list()


def test_a_ninety_ten_canary_lands_within_three_points_over_a_thousand_requests(cluster, routed):
    core = client.CoreV1Api(cluster.api)
    before = engine_counts(core, routed.namespace, "minilm")

    async def send() -> list[int]:
        headers = {"Authorization": f"Bearer {TEAM_B}"}
        body = {"model": "minilm", "input": "InferGrid packs inference onto shared GPUs."}
        limit = asyncio.Semaphore(8)

        async def one(http: aiohttp.ClientSession) -> int:
            """Sent until answered: a 429 (team-b's 50 a second) is retried when it says."""
            while True:
                async with limit, http.post(f"{routed.url}/v1/embeddings", json=body,
                                            headers=headers) as resp:  # fmt: skip
                    await resp.read()
                    if resp.status != 429:
                        return resp.status
                    wait = float(resp.headers["Retry-After"])
                await asyncio.sleep(wait)

        async with aiohttp.ClientSession() as http:
            return await asyncio.gather(*(one(http) for _ in range(CANARY_REQUESTS)))

    statuses = asyncio.run(send())
    after = engine_counts(core, routed.namespace, "minilm")
    assert statuses.count(200) == CANARY_REQUESTS, sorted(set(statuses))
    canary = after[CANARY] - before[CANARY]
    stable = after[STABLE] - before[STABLE]
    share = 100 * canary / (canary + stable)
    print(f"canary share over {CANARY_REQUESTS} requests: {share:.1f}% "
          f"({canary:.0f} canary, {stable:.0f} stable)")  # fmt: skip
    assert canary + stable == CANARY_REQUESTS
    assert abs(share - 10) <= 3


def test_a_tenant_over_its_bucket_gets_429s_while_another_is_unaffected(routed):
    def call(key: str) -> tuple[int, str | None]:
        request = urllib.request.Request(
            f"{routed.url}/v1/embeddings", method="POST",
            data=b'{"model": "minilm", "input": "hello"}',
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, None
        except urllib.error.HTTPError as err:
            return err.code, err.headers.get("Retry-After")

    a = [call(TEAM_A) for _ in range(6)]  # burst 2, 1 a second
    b = [call(TEAM_B) for _ in range(6)]
    assert [s for s, _ in a].count(429) >= 3, a
    assert all(int(r) >= 1 for s, r in a if s == 429)
    assert [s for s, _ in b] == [200] * 6


def test_a_service_at_zero_replicas_answers_its_first_request_then_goes_back_to_zero(
    cluster, routed
):
    core = client.CoreV1Api(cluster.api)
    assert engine_pods(core, routed.namespace, "minilm-on-demand") == []
    started = time.monotonic()
    vectors = ai(routed).embeddings.create(model="minilm-on-demand", input="wake up")
    waited = time.monotonic() - started
    print(f"first request to a service at zero answered after {waited:.1f} s")
    assert len(vectors.data[0].embedding) == 384
    spec = read_service(cluster.api, routed.namespace, "minilm-on-demand")["spec"]
    assert spec["replicas"] >= 1
    # Idle: the autoscaler brings it back to zero after its 30 s window.
    wait_until(
        lambda: read_service(cluster.api, routed.namespace, "minilm-on-demand")["spec"][
            "replicas"] == 0,
        240, "minilm-on-demand back at zero replicas",
    )  # fmt: skip


def test_an_engine_killed_mid_stream_ends_the_stream_with_an_error_and_the_next_request_is_served(
    cluster, routed
):
    core = client.CoreV1Api(cluster.api)
    pods = wait_ready_pods(core, routed.namespace, "smollm2", 2)
    stream = ai(routed).chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Tell me a long story."}],
        max_tokens=2000, temperature=0, stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = iter(stream)
    for _ in range(3):
        next(chunks)
    victim = next(p for p in pods if running(p) > 0)
    killed = kill_pod_processes(victim.metadata.uid)
    assert killed, f"no process of pod {victim.metadata.name} found on this machine"
    with pytest.raises(openai.APIError) as ended:
        for _ in chunks:
            pass
    assert "failed before it ended" in str(ended.value)
    answer = ai(routed).chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert answer.choices[0].message.content is not None


def engine_metrics(pod: client.V1Pod) -> str:
    """The text of the pod's engine's /metrics (this machine reaches the node's pod IPs)."""
    with urllib.request.urlopen(f"http://{pod.status.pod_ip}:8000/metrics", timeout=10) as r:
        return r.read().decode()


def running(pod: client.V1Pod) -> float:
    """Sequences the pod's engine is generating now."""
    return parse_engine_metrics(engine_metrics(pod)).running or 0.0


def kill_pod_processes(uid: str) -> list[int]:
    """SIGKILL every process of the pod's containers (found by the pod's cgroup, on this
    machine, where the real node's containers run): an engine dying without a drain."""
    forms = (uid, uid.replace("-", "_"))
    killed = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            groups = (proc / "cgroup").read_text()
            command = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if any(f in groups for f in forms) and b"pause" not in command.split(b"\0")[0]:
            os.kill(int(proc.name), signal.SIGKILL)
            killed.append(int(proc.name))
    return killed
