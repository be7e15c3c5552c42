"""Every sample of deploy/samples served for real, as a user runs it: `kubectl apply` of the
file as it is, every engine pod Ready on the real node, and an answer through the sample's
Service (`kubectl port-forward` + the `openai` client): a chat for the chat models, and for
the embedding model vectors of the right dimension equal to transformers' on the same
weights. smollm2-shared.yaml is served, scaled and deleted in test_serving.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import yaml
from kubernetes import client

from e2e.cluster.node_configs import REAL_NODE_LABEL
from e2e.cluster.processes import wait_until
from e2e.operator_support import SAMPLES, SERVICE_LABEL, kubectl
from e2e.real_pods import logs_of, port_forward, serving_namespace
from infergrid.storage_uri import PVC_MOUNT_ROOT

pytestmark = pytest.mark.e2e

SERVED_ELSEWHERE = {"smollm2-shared.yaml"}  # test_serving.py
SAMPLE_FILES = sorted(p for p in SAMPLES.glob("*.yaml") if p.name not in SERVED_ELSEWHERE)
READY_TIMEOUT = 900  # a first start unpacks the engine image; three pods load at once
TEXTS = ["InferGrid packs inference onto shared GPUs.", "A cat sat on the mat.", "Bonjour !"]


@pytest.fixture(scope="module")
def samples_namespace(cluster, identities, infsvc_crd, extender, tmp_path_factory) -> Iterator[str]:
    """A namespace with the model store's claim in it and the operator serving it."""
    if not cluster.local:
        pytest.skip("serves on the local cluster's real node")
    log = tmp_path_factory.mktemp("samples") / "operator.log"
    with serving_namespace(cluster.api, identities, "samples", log) as namespace:
        yield namespace


def test_every_sample_is_served_by_one_of_the_e2e_tests():
    assert {p.name for p in SAMPLE_FILES} | SERVED_ELSEWHERE == {
        p.name for p in SAMPLES.glob("*.yaml")
    }


def test_every_runtime_sample_is_served_by_the_test_of_its_runtime():
    """deploy/samples/runtimes/: llama.cpp's is served on the real node by test_llama_cpp.py
    (the other runtimes need CUDA images; test_runtimes.py dry-runs what they render)."""
    source = (Path(__file__).parent / "test_llama_cpp.py").read_text()
    for path in (SAMPLES / "runtimes").glob("*.yaml"):
        assert f'"{path.name}"' in source, f"test_llama_cpp.py does not apply {path.name}"


# The scheduling features' examples, each applied through the operator on KWOK nodes by the
# test of its feature (placement is what they show; serving is shown by the samples above).
SCHEDULING_SAMPLES = {
    "online-offline.yaml": "test_preemption.py",
    "gpu-models.yaml": "test_gpu_models.py",
    "quota.yaml": "test_quotas.py",
    "time-slicing.yaml": "test_time_slicing.py",
}


def test_every_scheduling_sample_is_applied_by_the_test_of_its_feature():
    assert {p.name for p in (SAMPLES / "scheduling").glob("*.yaml")} == set(SCHEDULING_SAMPLES)
    here = Path(__file__).parent
    for sample, test in SCHEDULING_SAMPLES.items():
        source = (here / test).read_text()
        assert f'"scheduling" / "{sample}"' in source, f"{test} does not apply {sample}"


def test_every_gateway_sample_is_applied_by_the_gateways_test():
    """The gateway's samples (keys, a canary, scale to zero) are served by test_gateway.py,
    which puts the gateway in front of them on the real node (the keys through
    gateway_support.gateway_namespace, as every gateway test's)."""
    here = Path(__file__).parent
    source = "".join((here / f).read_text() for f in ("test_gateway.py", "gateway_support.py"))
    for path in (SAMPLES / "gateway").glob("*.yaml"):
        assert f'"{path.name}"' in source, f"test_gateway.py does not apply {path.name}"


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=[p.name for p in SAMPLE_FILES])
def test_the_sample_serves_from_the_real_node(cluster, samples_namespace, path: Path):
    namespace = samples_namespace
    body = yaml.safe_load(path.read_text())
    name, spec = body["metadata"]["name"], body["spec"]
    core = client.CoreV1Api(cluster.api)
    kubectl(cluster.kubeconfig, "apply", "-n", namespace, "-f", str(path))
    try:
        pods = wait_all_ready(cluster.api, namespace, name)
        gpu_service = {"gpus", "gpuMemoryMiB", "migProfile"} & spec["resources"].keys()
        for pod in pods:
            assert core.read_node(pod.spec.node_name).metadata.labels.get(REAL_NODE_LABEL)
            assert pod.status.container_statuses[0].restart_count == 0
            if not gpu_service:  # CPU-only: placed with no GPU scheduler, holding no GPU
                assert pod.spec.scheduler_name == "default-scheduler"
                assert not (pod.spec.containers[0].resources.limits or {})
        _check_storage(core, namespace, pods, spec)
        with port_forward(cluster.kubeconfig, namespace, f"svc/{name}", 80) as url:
            ai = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120)
            if spec["model"].get("task") == "embedding":
                _check_embeddings(ai, spec["model"])
            else:
                _check_chat(ai, spec["model"]["name"])
            if spec["model"]["storageUri"] in JUDGED_BY_TRANSFORMERS:
                _check_greedy_against_transformers(ai, spec["model"])
    finally:
        kubectl(cluster.kubeconfig, "delete", "-n", namespace, "-f", str(path))
        wait_until(lambda: not _pods(core, namespace, name), 180, f"the pods of {name} gone")


def _pods(core: client.CoreV1Api, namespace: str, name: str) -> list[client.V1Pod]:
    return core.list_namespaced_pod(namespace, label_selector=f"{SERVICE_LABEL}={name}").items


def wait_all_ready(api: client.ApiClient, namespace: str, name: str) -> list[client.V1Pod]:
    """Every replica the operator asked for, over every track, Ready."""
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)

    def ready() -> list[client.V1Pod] | None:
        selector = f"{SERVICE_LABEL}={name}"
        deployments = apps.list_namespaced_deployment(namespace, label_selector=selector).items
        wanted = sum(d.spec.replicas or 0 for d in deployments)
        pods = [p for p in _pods(core, namespace, name) if _is_ready(p)]
        return pods if wanted and len(pods) == wanted else None

    wait_until(lambda: ready() is not None, READY_TIMEOUT, f"every engine pod of {name} Ready")
    pods = ready()
    assert pods is not None
    return pods


def _is_ready(pod: client.V1Pod) -> bool:
    conditions = pod.status.conditions or []
    return pod.metadata.deletion_timestamp is None and any(
        c.type == "Ready" and c.status == "True" for c in conditions
    )


def _check_storage(core, namespace: str, pods: list, spec: dict) -> None:
    """Each pod read its weights where its track's URI says: a pvc:// one inside the claim's
    read-only mount."""
    for pod in pods:
        track = pod.metadata.labels["infergrid.io/track"]
        uri = (spec["canary"] if track == "canary" else spec["model"])["storageUri"]
        log = logs_of(core, namespace, pod.metadata.name)
        if uri.startswith("pvc://"):
            assert f" from {PVC_MOUNT_ROOT}/{uri.removeprefix('pvc://')}" in log, log
        assert "no CUDA device is visible" in log, log  # no GPU here: said once, on the CPU


def _check_chat(ai: openai.OpenAI, model: str) -> None:
    answer = ai.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is a GPU? Answer in one sentence."}],
        max_tokens=16,
        temperature=0,
    )
    assert answer.choices[0].message.content.strip()
    assert answer.usage.completion_tokens > 0


def _check_embeddings(ai: openai.OpenAI, model: dict) -> None:
    got = ai.embeddings.create(model=model["name"], input=TEXTS)
    vectors = np.array([d.embedding for d in got.data])
    expected = reference_embeddings(model["storageUri"], TEXTS)
    assert vectors.shape == expected.shape == (len(TEXTS), 384)
    cosines = np.sum(vectors * expected, axis=1) / (
        np.linalg.norm(vectors, axis=1) * np.linalg.norm(expected, axis=1)
    )
    assert np.all(cosines > 1 - 1e-4), cosines


# A family other than the demo's, its greedy tokens judged against transformers' (below).
JUDGED_BY_TRANSFORMERS = {"pkg://gemma3-270m"}
PROMPTS = ("The capital of France is", "Water boils at", "Once upon a time")
GREEDY_TOKENS = 16
# How far below transformers' best logit a served token may score: the pod's int8 weights
# may tip a near-tie. Measured with int8 weights on these and two more prompts, 16 tokens
# each: 78 of 80 tokens were transformers' own best, the other two 0.014 and 0.069 below.
NEAR_TIE_LOGITS = 0.25


def _check_greedy_against_transformers(ai: openai.OpenAI, model: dict) -> None:
    """Each prompt's greedy completion from the pod, scored by transformers on the float
    weights with the served tokens fed back (teacher forcing): every served token is its
    best, or a near-tie. Free-running, one tipped tie would make the whole tail differ."""
    import torch
    from transformers import AutoModelForCausalLM

    from batching_engine.model_source import resolve_model_dir
    from batching_engine.tokenizer import Tokenizer

    model_dir = resolve_model_dir(model["storageUri"])
    tokenizer = Tokenizer(model_dir)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for prompt in PROMPTS:
        answer = ai.completions.create(
            model=model["name"], prompt=prompt, max_tokens=GREEDY_TOKENS, temperature=0
        )
        text = answer.choices[0].text
        served = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(served) == text  # the served tokens, re-read from their text
        ids = tokenizer.encode(prompt)
        with torch.inference_mode():
            logits = reference(torch.tensor([ids + served])).logits[0, len(ids) - 1 : -1]
        best = logits.max(dim=-1).values
        gaps = best - logits[torch.arange(len(served)), torch.tensor(served)]
        assert float(gaps.max()) <= NEAR_TIE_LOGITS, (prompt, text, gaps.tolist())


def reference_embeddings(uri: str, texts: list[str]) -> np.ndarray:
    """transformers' vectors on the same files: mean over the tokens, L2-normalised (the
    model's sentence-transformers config asks for both)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from batching_engine.model_source import resolve_model_dir

    model_dir = resolve_model_dir(uri)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()
