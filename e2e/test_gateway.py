"""The gateway on the real node: one OpenAI URL for every InferenceService of a namespace.

The gateway runs as the chart installs it (a release with only the gateway on, from the
image built here), in a pod on the real node, in front of engine pods on the same node; the
operator runs beside the test, reading the gateway's pending requests. The test reaches
the gateway as a user does, through `kubectl port-forward` of its Service and the `openai`
client, and counts what the engines received from their own /metrics.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import aiohttp
import openai
import pytest
import yaml
from kubernetes import client

from e2e.cluster.processes import wait_until
from e2e.gateway_support import (
    TEAM_A,
    TEAM_B,
    chat_service,
    engine_metrics,
    engine_pods,
    gateway_namespace,
    kill_pod_processes,
    running,
    sample,
    wait_ready_pods,
)
from e2e.helm_release import helm
from e2e.operator_support import kubectl, read_service
from e2e.real_pods import port_forward, serving_namespace
from harness.engine_process import requests_seen
from infergrid.tracks import CANARY, STABLE, track_of_pod

pytestmark = pytest.mark.e2e

CANARY_REQUESTS = 1000


class Routed:
    def __init__(self, namespace: str, url: str, metrics_url: str):
        self.namespace, self.url, self.metrics_url = namespace, url, metrics_url


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
    namespace, release, metrics_url = gateway_namespace(cluster, "gateway")
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
    models = [m.id for m in client_.models.list().data]
    served = ["minilm", "minilm-on-demand", "smollm2"]  # then each qualified by its namespace
    assert models == [*served, *(f"{routed.namespace}/{m}" for m in served)]
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
