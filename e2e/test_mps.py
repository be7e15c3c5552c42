"""Two engines on shares of one GPU of the real node, with the chart's device plugin in MPS
mode, as a user installs it: `helm install … --set devicePlugin.config.mps=true`.

The device plugin's DaemonSet then runs an MPS control daemon container beside the plugin,
one daemon per GPU that offers shares (on the real node's fake NVML, the stand-in control
program, which records what it is told). Two InferenceServices of the shared sample, the
second made once the first serves, land on one GPU; each engine pod gets that GPU's pipe
folder and the daemons' shared memory mounted, its memory limit from its share and its SM
share from gpuCores (or the plugin's default), and both serve."""

from __future__ import annotations

import base64
import json
import shutil
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from e2e.cluster.local_cluster import DEFAULT_FLEET, LocalCluster
from e2e.cluster.processes import wait_until
from e2e.helm_release import Release, component_pods, helm, install_on_real_node
from e2e.operator_support import SAMPLES, container_statuses, create_service, kubectl
from e2e.real_pods import port_forward
from inference_operator.engine_access import token_secret_name
from infergrid.assignment_annotation import decode_assignment
from infergrid.constants import ANNOTATION_GPU_ASSIGNMENT, LABEL_INFERENCESERVICE
from infergrid.engine_token import HEADER, SECRET_KEY
from infergrid.fleet import FleetNode, load_fleet

pytestmark = pytest.mark.e2e

SAMPLE = SAMPLES / "smollm2-shared.yaml"
# The first start on a node unpacks the engine image (torch) from containerd's store.
READY_TIMEOUT = 600
RECORD = "fake-mps-control.jsonl"


@pytest.fixture(scope="module")
def mps(cluster, helm_ready, namespaces, infsvc_crd) -> Iterator[tuple[Release, FleetNode, Path]]:
    """The chart on the real node with MPS on, its daemons' folder under a fresh host path
    (removed after, with the release), the cluster's own plugin stopped meanwhile."""
    if not cluster.local:
        pytest.skip("installs the images built here on the local cluster's real node")
    real = next(n for n in load_fleet(DEFAULT_FLEET).nodes if n.real)
    root = Path(f"/run/infergrid-e2e-{uuid.uuid4().hex[:6]}")
    with LocalCluster().host_device_plugin_stopped(real):
        rel = install_on_real_node(
            cluster, namespaces, "--set", "devicePlugin.config.mps=true",
            "--set", f"devicePlugin.config.mpsRoot={root}", "--set", "gateway.enabled=false",
        )  # fmt: skip
        try:
            yield rel, real, root
        finally:
            helm(cluster, "uninstall", rel.name, "--namespace", rel.namespace, "--wait")
            # The DaemonSet is gone before its pod is; the daemons' container keeps its
            # daemons up until it stops.
            wait_until(lambda: not component_pods(cluster, rel, "device-plugin"), 120,
                       "the device plugin pod gone")  # fmt: skip
            shutil.rmtree(root, ignore_errors=True)


def records(root: Path, gpu: str) -> list[dict]:
    path = root / gpu / "log" / RECORD
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def share_gpus(real: FleetNode) -> list[str]:
    return [g.uuid for g in real.inventory.gpus if not g.mig_instances]


def test_the_daemon_container_runs_beside_the_plugin_one_daemon_per_share_gpu(cluster, mps):
    rel, real, root = mps

    def both_ready() -> bool:
        pods = component_pods(cluster, rel, "device-plugin")
        return len(pods) == 1 and all(s.ready for s in container_statuses(pods[0]))

    wait_until(both_ready, 120, "the device plugin pod's containers Ready")
    (pod,) = component_pods(cluster, rel, "device-plugin")
    statuses = {s.name: s for s in container_statuses(pod)}
    assert set(statuses) == {"device-plugin", "mps-control-daemon"}
    assert statuses["mps-control-daemon"].state.running and statuses["device-plugin"].ready
    shared = share_gpus(real)
    assert shared and len(shared) < len(real.inventory.gpus)  # the MIG GPU gets none

    def probed(gpu: str) -> bool:
        return any(r["command"] == "get_server_list" for r in records(root, gpu))

    for gpu in shared:
        wait_until(lambda gpu=gpu: probed(gpu), 60, f"the daemon of {gpu} probed")
        (started, *_) = records(root, gpu)
        assert (started["command"], started["visibleDevices"]) == ("-d", gpu)
        assert (root / gpu / "pipe" / "control").is_socket()
    mig = [g.uuid for g in real.inventory.gpus if g.mig_instances]
    assert all(not (root / gpu).exists() for gpu in mig)


def service(name: str, cores: int | None) -> dict:
    """The shared sample, one replica, under `name`; without gpuCores when `cores` is None."""
    body = yaml.safe_load(SAMPLE.read_text())
    body["metadata"]["name"] = body["spec"]["model"]["name"] = name
    body["spec"]["autoscaling"] = {"enabled": False}
    body["spec"]["replicas"] = 1
    body["spec"]["resources"] = {"gpuMemoryMiB": 4096}
    if cores is not None:
        body["spec"]["resources"]["gpuCores"] = cores
    return body


def serving_pod(core: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod:
    def ready() -> list[client.V1Pod]:
        pods = core.list_namespaced_pod(
            namespace, label_selector=f"{LABEL_INFERENCESERVICE}={name}"
        ).items
        return [p for p in pods if all(s.ready for s in container_statuses(p) or [False])]

    wait_until(lambda: len(ready()) == 1, READY_TIMEOUT, f"the engine of {name} Ready")
    return ready()[0]


def assigned_gpu(pod: client.V1Pod) -> str:
    assignment = decode_assignment(pod.metadata.annotations[ANNOTATION_GPU_ASSIGNMENT])
    ((gpu,),) = [c.gpus for c in assignment.containers]
    return gpu.uuid


def pod_env(cluster, namespace: str, pod: client.V1Pod) -> dict[str, str]:
    text = kubectl(cluster.kubeconfig, "exec", "-n", namespace, pod.metadata.name, "--", "env")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def complete(cluster, namespace: str, name: str) -> dict:
    """A completion straight from the service's engines, with the engine token the chart's
    operator wrote for it in its namespace (what the gateway sends)."""
    body = json.dumps({"model": name, "prompt": "A GPU is", "max_tokens": 4}).encode()
    secret = client.CoreV1Api(cluster.api).read_namespaced_secret(
        token_secret_name(name), namespace
    )
    headers = {"Content-Type": "application/json",
               HEADER: base64.b64decode(secret.data[SECRET_KEY]).decode()}  # fmt: skip
    with port_forward(cluster.kubeconfig, namespace, f"svc/{name}", 80) as url:
        request = urllib.request.Request(f"{url}/v1/completions", body, headers)
        with urllib.request.urlopen(request, timeout=120) as resp:
            return json.loads(resp.read())


def test_two_engines_on_shares_of_one_gpu_start_and_serve_under_mps_limits(cluster, mps):
    """The second engine starts once the first serves (a scale-up or a rollout beside a
    running neighbour), on the same GPU; each sees its own limits, the GPU's daemon pipe
    and the daemons' shared memory, and both answer a completion."""
    rel, real, root = mps
    namespace, core = rel.served, client.CoreV1Api(cluster.api)
    (root / "shm" / "from-the-host").write_text("shared")
    create_service(cluster.api, namespace, service("chat-a", 30))
    first = serving_pod(core, namespace, "chat-a")
    create_service(cluster.api, namespace, service("chat-b", None))
    second = serving_pod(core, namespace, "chat-b")
    gpu = assigned_gpu(first)
    assert assigned_gpu(second) == gpu, "binpack puts both shares on one GPU"
    pipe = str(root / gpu / "pipe")
    default_cores = str(100 // 10)  # 100 / the chart's vgpuSlotsPerGpu
    for pod, cores in ((first, "30"), (second, default_cores)):
        env = pod_env(cluster, namespace, pod)
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == pipe
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == cores
        assert env["INFERGRID_GPU_MEMORY_MIB"] == "4096"
        seen = kubectl(cluster.kubeconfig, "exec", "-n", namespace, pod.metadata.name, "--",
                       "sh", "-c", f"ls {pipe}; cat /dev/shm/from-the-host")  # fmt: skip
        assert {"control", "nvidia-cuda-mps-control.pid"} <= set(seen.split()), seen
        assert seen.split()[-1] == "shared"
        assert all(s.restart_count == 0 for s in container_statuses(pod))
    for name in ("chat-a", "chat-b"):
        answer = complete(cluster, namespace, name)
        assert answer["choices"][0]["text"], answer
