"""An InferenceService served from a pod on the real node, as a user reaches it: `kubectl
apply` of the sample, `kubectl port-forward` to its Service and the `openai` client,
`kubectl scale`, and deletion that leaves nothing behind."""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from kubernetes import client

from e2e.cluster.node_configs import REAL_NODE_LABEL
from e2e.cluster.processes import wait_until
from e2e.operator_support import (
    SAMPLES,
    kubectl,
    owned,
)
from e2e.real_pods import port_forward, serving_namespace
from infergrid import constants

pytestmark = pytest.mark.e2e

SAMPLE = SAMPLES / "smollm2-shared.yaml"
NAME = "smollm2"
# The first start on a node unpacks the engine image (torch) from containerd's store.
READY_TIMEOUT = 600


@pytest.fixture(scope="module")
def served(cluster, identities, infsvc_crd, extender, tmp_path_factory) -> Iterator[str]:
    """A namespace with the operator serving it and the sample applied, unmodified."""
    if not cluster.local:
        pytest.skip("serves on the local cluster's real node")
    core = client.CoreV1Api(cluster.api)
    log = tmp_path_factory.mktemp("serving") / "operator.log"
    with serving_namespace(cluster.api, identities, "serve", log) as namespace:
        kubectl(cluster.kubeconfig, "apply", "-n", namespace, "-f", str(SAMPLE))
        try:
            yield namespace
        finally:
            kubectl(cluster.kubeconfig, "delete", "--ignore-not-found", "--wait=false",
                    "-n", namespace, "-f", str(SAMPLE))  # fmt: skip
            wait_until(lambda: not _engine_pods(core, namespace), 120, "the engine pods gone")


def _engine_pods(core: client.CoreV1Api, namespace: str) -> list[client.V1Pod]:
    selector = f"infergrid.io/inferenceservice={NAME}"
    return core.list_namespaced_pod(namespace, label_selector=selector).items


def _ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def wait_serving(core: client.CoreV1Api, namespace: str, count: int) -> list[client.V1Pod]:
    """At least `count` Ready engine pods (the autoscaler may add more under load)."""

    def ready() -> list[client.V1Pod]:
        return [p for p in _engine_pods(core, namespace) if _ready(p)]

    wait_until(lambda: len(ready()) >= count, READY_TIMEOUT, f"{count} engine pod(s) Ready")
    return ready()


def test_the_sample_gets_an_engine_pod_on_the_real_node_with_its_allocation(cluster, served):
    core = client.CoreV1Api(cluster.api)
    pod = wait_serving(core, served, 1)[0]
    node = core.read_node(pod.spec.node_name)
    assert node.metadata.labels.get(REAL_NODE_LABEL) == "true"
    status = pod.status.container_statuses[0]
    assert status.ready and status.restart_count == 0
    env = kubectl(cluster.kubeconfig, "exec", "-n", served, pod.metadata.name, "--", "env")
    lines = dict(line.split("=", 1) for line in env.splitlines() if "=" in line)
    assert lines["INFERGRID_GPU_MEMORY_MIB"] == "4096"
    # The device list comes as the kubelet's mounts (the plugin's default strategy).
    assert lines["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    listed = kubectl(cluster.kubeconfig, "exec", "-n", served, pod.metadata.name, "--",
                     "ls", "/var/run/nvidia-container-devices")  # fmt: skip
    assert [d for d in listed.split() if d.startswith("GPU-")] == listed.split() != []
    text = pod.metadata.annotations[constants.ANNOTATION_GPU_ASSIGNMENT]
    assert pod.spec.node_name in text


def test_the_engine_pod_holds_the_demo_models_weights_as_int4_through_the_cpu_kernel(
    cluster, served
):
    """The image's gcc builds the CPU kernels in the pod (into /tmp), so `auto` keeps the
    GGUF's Q4_1 weights as int4 on the real node's CPU."""
    core = client.CoreV1Api(cluster.api)
    pod = wait_serving(core, served, 1)[0]
    log = core.read_namespaced_pod_log(pod.metadata.name, served)
    weights = [line for line in log.splitlines() if "weights: " in line]
    assert weights and "weights: int4 (auto: the checkpoint's Q4_1" in weights[-1], log[-2000:]
    assert "CPU kernel AVX" in weights[-1]


def test_kubectl_scale_gives_a_second_serving_pod(cluster, served):
    """Before any load: the autoscaler, idle, keeps a hand-set count for its window."""
    core = client.CoreV1Api(cluster.api)
    wait_serving(core, served, 1)
    kubectl(cluster.kubeconfig, "scale", "-n", served, "infsvc", NAME, "--replicas", "2")
    pods = wait_serving(core, served, 2)
    assert len({p.metadata.name for p in pods}) >= 2


def test_a_chat_completion_streams_through_the_service(cluster, served):
    wait_serving(client.CoreV1Api(cluster.api), served, 1)
    with port_forward(cluster.kubeconfig, served, f"svc/{NAME}", 80) as url:
        ai = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120)
        stream = ai.chat.completions.create(
            model=NAME,
            messages=[{"role": "user", "content": "What is a GPU? Answer in one sentence."}],
            max_tokens=16,
            temperature=0,
            stream=True,
        )
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len([p for p in pieces if p]) >= 2  # more than one chunk: it streamed
    assert "".join(pieces).strip()


# What the engine container reports of itself: user, token, writable paths, privileges.
SELF_CHECK = (
    "id -u; id -g;"
    " test -e /var/run/secrets/kubernetes.io/serviceaccount && echo token || echo no-token;"
    " touch /opt/.probe 2>/dev/null && echo root-writable || echo root-read-only;"
    " touch /tmp/.probe && echo tmp-writable;"
    " grep -E '^(NoNewPrivs|CapEff|Seccomp):' /proc/self/status"
)


def test_the_engine_pod_runs_restricted_without_a_service_account_token(cluster, served):
    """The engine image is the tenant's: no API token, no root, no privilege, no writes
    outside /tmp and its mounts, on the real node's runtime (not only in the manifest)."""
    core = client.CoreV1Api(cluster.api)
    pod = wait_serving(core, served, 1)[0]
    assert pod.spec.automount_service_account_token is False
    assert not [v.name for v in pod.spec.volumes if v.projected]  # no kube-api-access-*
    (engine,) = pod.spec.containers
    assert not [m for m in engine.volume_mounts if m.mount_path.startswith("/var/run/secrets")]
    context = pod.spec.security_context
    assert (context.run_as_non_root, context.run_as_user, context.run_as_group) == (
        True, 65532, 65532,
    )  # fmt: skip
    assert context.seccomp_profile.type == "RuntimeDefault"
    assert engine.security_context.read_only_root_filesystem is True
    assert engine.security_context.allow_privilege_escalation is False
    assert engine.security_context.capabilities.drop == ["ALL"]
    out = kubectl(cluster.kubeconfig, "exec", "-n", served, pod.metadata.name, "--",
                  "sh", "-c", SELF_CHECK).split("\n")  # fmt: skip
    assert out[:5] == ["65532", "65532", "no-token", "root-read-only", "tmp-writable"]
    status = dict(line.split(":\t", 1) for line in out[5:] if ":\t" in line)
    assert status["NoNewPrivs"] == "1"
    assert int(status["CapEff"], 16) == 0
    assert status["Seccomp"] == "2"  # filter mode: the runtime's default profile
    # Issue 18, point 12: the runtime image carries no installer or build tool to use.
    probe = ("import importlib.util as u; "
             "print(*[m for m in ('pip', 'setuptools', 'wheel', 'pytest', 'grpc_tools')"
             " if u.find_spec(m)])")  # fmt: skip
    found = kubectl(cluster.kubeconfig, "exec", "-n", served, pod.metadata.name, "--",
                    "python3", "-c", probe)  # fmt: skip
    assert found.strip() == ""


def post(url: str, body: bytes) -> tuple[int, dict, float]:
    """Status, JSON answer and seconds taken of one POST."""
    started = time.perf_counter()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    return status, json.loads(raw), time.perf_counter() - started


def test_a_prompt_of_megabytes_is_refused_at_once_and_liveness_stays_fast(
    cluster, served, record_property
):
    """Issue 18, point 8, against the engine pod on the real node (its pod IP; kubectl
    port-forward would time its own copying of the 4 MiB): a prompt just under the 4 MiB
    body limit is refused by its length (400, never tokenized), a 4 MiB one by the body
    limit (413), and /healthz answers meanwhile. The seconds are printed, not asserted."""
    pod = wait_serving(client.CoreV1Api(cluster.api), served, 1)[0]
    url = f"http://{pod.status.pod_ip}:8000"
    limit = 4 << 20
    for size, status, param in ((limit - (64 << 10), 400, "prompt"), (limit, 413, "body")):
        body = json.dumps({"model": NAME, "prompt": "a" * size, "max_tokens": 1}).encode()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            refused = pool.submit(post, f"{url}/v1/completions", body)
            with urllib.request.urlopen(f"{url}/healthz", timeout=30) as health:
                assert health.status == 200
            got, doc, seconds = refused.result(timeout=120)
        assert got == status, doc
        assert doc["error"]["param"] == param, doc
        record_property(f"refused_{size}_bytes_seconds", round(seconds, 3))
        print(f"a {size}-byte prompt refused with {status} in {seconds:.3f} s")


def test_deleting_the_service_removes_everything(cluster, served):
    core = client.CoreV1Api(cluster.api)
    kubectl(cluster.kubeconfig, "delete", "-n", served, "-f", str(SAMPLE))

    def gone() -> bool:
        children = owned(cluster.api, served, NAME)
        return not any(children.values()) and not _engine_pods(core, served)

    wait_until(gone, 120, f"every child of {NAME} deleted")
