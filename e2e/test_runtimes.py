"""Each serving runtime's InferenceService, accepted by the API server, and the children the
operator renders for it accepted by a server-side dry run: the manifests a vLLM, SGLang,
llama.cpp or custom service gets are ones Kubernetes takes, though their images (CUDA, the
runtimes' own) are not built here."""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client

from e2e.operator_support import kubectl
from inference_operator.render import render_children
from inference_operator.spec import parse_spec

pytestmark = pytest.mark.e2e

GROUP, VERSION, PLURAL = "infergrid.io", "v1alpha1", "inferenceservices"
CUSTOM = {
    "port": 9000, "readyPath": "/ready", "livePath": "/live", "args": ["--serve"],
    "metrics": {"queueDepth": "tgi_queue_size", "running": "tgi_batch_current_size"},
}  # fmt: skip
RUNTIMES = {
    "vllm": ({"runtime": "vllm", "engine": {"image": "registry.example.com/infergrid/vllm:1"}},
             "pvc://models/llama-3-8b"),
    "sglang": ({"runtime": "sglang", "engine": {"image": "registry.example.com/sglang:1"}},
               "pvc://models/qwen3-8b"),
    "llama.cpp": ({"runtime": "llama.cpp", "engine": {"image": "registry.example.com/lc:1"}},
                  "pvc://models/smollm2.Q4_1.gguf"),
    "custom": ({"runtime": "custom", "customRuntime": CUSTOM,
                "engine": {"image": "registry.example.com/tgi:1"}}, "file:///models/m"),
}  # fmt: skip


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_service_and_what_the_operator_renders_for_it_are_accepted(
    cluster, namespace, infsvc_crd, runtime
):
    extra, uri = RUNTIMES[runtime]
    body = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService",
        "metadata": {"name": "svc"},
        "spec": {"model": {"name": "m", "storageUri": uri}, "resources": {"gpus": 1}, **extra},
    }  # fmt: skip
    stored = client.CustomObjectsApi(cluster.api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )
    spec = parse_spec(stored["spec"], "unused", "infergrid-scheduler", name="svc")
    children = render_children(spec, "svc", namespace)
    document = yaml.safe_dump_all(children)
    kubectl(cluster.kubeconfig, "apply", "--dry-run=server", "-n", namespace, "-f", "-",
            stdin=document)  # fmt: skip
    (deployment,) = [c for c in children if c["kind"] == "Deployment"]
    (engine,) = deployment["spec"]["template"]["spec"]["containers"]
    assert engine["image"] == extra["engine"]["image"]
    assert engine["ports"][0]["containerPort"] == spec.runtime.port
