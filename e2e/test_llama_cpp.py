"""llama.cpp as a runtime, for real: deploy/samples/runtimes/smollm2-llama-cpp.yaml applied as
it is, in a namespace with the gateway as the chart installs it and the operator as its own
ServiceAccount with the images built here. The operator gives the service the llama-cpp image
(its runtimeImages); the pod, placed on a GPU share of the real node by the extender, runs
llama-server on SmolLM2's GGUF from the model-store claim. A chat streams through the gateway,
and a burst deeper than llama-server's slots scales the service on llama.cpp's own queue
series (`llamacpp:requests_deferred`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import openai
import pytest
import yaml
from kubernetes import client

from e2e.cluster.node_configs import REAL_NODE_LABEL
from e2e.cluster.node_images import image_ref
from e2e.cluster.processes import wait_until
from e2e.gateway_support import (
    TEAM_B,
    engine_metrics,
    engine_pods,
    gateway_namespace,
    wait_ready_pods,
)
from e2e.helm_release import helm
from e2e.operator_support import SAMPLES, events, kubectl, read_service
from e2e.real_pods import logs_of, port_forward, serving_namespace
from infergrid.constants import RESOURCE_GPU_MEMORY
from infergrid.engine_metrics import parse_engine_metrics
from infergrid.runtimes import RUNTIMES

pytestmark = pytest.mark.e2e

SAMPLE = SAMPLES / "runtimes" / "smollm2-llama-cpp.yaml"
BODY = yaml.safe_load(SAMPLE.read_text())
NAME, MODEL = BODY["metadata"]["name"], BODY["spec"]["model"]["name"]
LLAMA_CPP = RUNTIMES["llama.cpp"]
BURST = 12  # requests at once: six times the sample's two slots


@dataclass(frozen=True)
class Served:
    namespace: str
    url: str  # the gateway's, through kubectl port-forward


@pytest.fixture(scope="module")
def served(
    cluster, identities, infsvc_crd, extender, helm_ready, tmp_path_factory
) -> Iterator[Served]:
    if not cluster.local:
        pytest.skip("serves on the local cluster's real node")
    core = client.CoreV1Api(cluster.api)
    log = tmp_path_factory.mktemp("llama-cpp") / "operator.log"
    namespace, release, metrics_url = gateway_namespace(cluster, "llama-cpp")
    with serving_namespace(cluster.api, identities, "", log, namespace=namespace,
                           operator_args=("--gateway-metrics-url", metrics_url)):  # fmt: skip
        try:
            kubectl(cluster.kubeconfig, "apply", "-n", namespace, "-f", str(SAMPLE))
            wait_ready_pods(core, namespace, NAME, 1)
            service = f"svc/{release}-infergrid-gateway"
            with port_forward(cluster.kubeconfig, namespace, service, 80) as url:
                yield Served(namespace, url)
        finally:
            helm(cluster, "uninstall", release, "--namespace", namespace, "--wait")


def llama_metrics(pod: client.V1Pod) -> str:
    return engine_metrics(pod, LLAMA_CPP.port)


def counter(text: str, name: str) -> float:
    """One of llama-server's unlabelled counters."""
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in llama-server's /metrics")


def test_the_pod_runs_llama_server_from_the_operators_image_on_a_gpu_share(cluster, served):
    core = client.CoreV1Api(cluster.api)
    (pod,) = engine_pods(core, served.namespace, NAME)
    assert core.read_node(pod.spec.node_name).metadata.labels.get(REAL_NODE_LABEL)
    (container,) = pod.spec.containers
    assert container.image == image_ref("llama-cpp")
    assert [p.container_port for p in container.ports] == [LLAMA_CPP.port]
    assert "--metrics" in container.args
    assert container.resources.limits[RESOURCE_GPU_MEMORY] == "2048"
    assert pod.status.container_statuses[0].restart_count == 0
    log = logs_of(core, served.namespace, pod.metadata.name)
    assert "smollm2-135m-instruct.Q4_1.gguf" in log, log


def test_a_chat_streams_through_the_gateway_from_llama_server(cluster, served):
    core = client.CoreV1Api(cluster.api)
    (pod,) = engine_pods(core, served.namespace, NAME)
    before = counter(llama_metrics(pod), "llamacpp:tokens_predicted_total")
    ai = openai.OpenAI(base_url=f"{served.url}/v1", api_key=TEAM_B, timeout=120, max_retries=0)
    assert MODEL in [m.id for m in ai.models.list().data]
    stream = ai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is a GPU?"}],
        max_tokens=12, temperature=0, stream=True,
    )  # fmt: skip
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len([p for p in pieces if p]) >= 2, pieces
    after = counter(llama_metrics(pod), "llamacpp:tokens_predicted_total")
    assert after - before >= 2  # llama-server generated them, not something else


def test_a_burst_deeper_than_its_slots_scales_it_on_llama_cpps_own_queue(cluster, served):
    core = client.CoreV1Api(cluster.api)
    (pod,) = engine_pods(core, served.namespace, NAME)
    deferred: list[float] = []  # llama-server's queue, a second apart

    async def burst() -> list[int]:
        headers = {"Authorization": f"Bearer {TEAM_B}"}
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400,
                "temperature": 0, "ignore_eos": True}  # fmt: skip

        async def one(http: aiohttp.ClientSession) -> int:
            async with http.post(f"{served.url}/v1/completions", json=body,
                                 headers=headers) as resp:  # fmt: skip
                await resp.read()
                return resp.status

        async def watch() -> None:
            while True:
                text = await asyncio.to_thread(llama_metrics, pod)
                deferred.append(parse_engine_metrics(text, LLAMA_CPP.metrics).queue_depth or 0)
                await asyncio.sleep(1)

        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            watcher = asyncio.create_task(watch())
            try:
                return await asyncio.gather(*(one(http) for _ in range(BURST)))
            finally:
                watcher.cancel()

    statuses = asyncio.run(burst())
    print(f"llama-server's deferred requests, a second apart: {deferred}")
    assert statuses == [200] * BURST
    assert max(deferred) >= 2, deferred  # llama-server held requests beyond its two slots
    wait_until(
        lambda: read_service(cluster.api, served.namespace, NAME)["spec"]["replicas"] == 2,
        60, "the autoscaler's scale-up to 2",
    )  # fmt: skip
    scaled = events(cluster.api, served.namespace, NAME, "Scaled")
    assert any("1 -> 2 replicas: queueDepth" in e for e in scaled), scaled
    pods = wait_ready_pods(core, served.namespace, NAME, 2)
    assert {p.spec.containers[0].image for p in pods} == {image_ref("llama-cpp")}
