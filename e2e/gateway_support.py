"""The gateway as the chart installs it, and the engine pods behind it, for the e2e tests
that call through it (test_gateway.py, and the attacks on it)."""

from __future__ import annotations

import os
import signal
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from e2e.cluster.node_images import image_ref
from e2e.cluster.processes import wait_until
from e2e.helm_release import CHART, helm
from e2e.operator_support import SAMPLES, kubectl
from infergrid.constants import LABEL_INFERENCESERVICE
from infergrid.engine_metrics import parse_engine_metrics
from infergrid.serving_config import DEFAULT_PORT

GATEWAY_SAMPLES = SAMPLES / "gateway"
KEYS = "infergrid-gateway-keys"
TEAM_A, TEAM_B = "sk-team-a-example-0001", "sk-team-b-example-0001"
READY_TIMEOUT = 900  # a first start unpacks the engine image; several pods load at once


def sample(name: str) -> dict:
    return yaml.safe_load((GATEWAY_SAMPLES / name).read_text())


def chat_service() -> dict:
    """The shared-GPU SmolLM2 sample with two fixed replicas, so one can die mid-stream."""
    body = yaml.safe_load((SAMPLES / "smollm2-shared.yaml").read_text())
    body["spec"]["autoscaling"] = {"enabled": False}
    body["spec"]["replicas"] = 2
    return body


def is_ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def engine_pods(core: client.CoreV1Api, namespace: str, service: str) -> list[client.V1Pod]:
    selector = f"{LABEL_INFERENCESERVICE}={service}"
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in pods if not p.metadata.deletion_timestamp]


def wait_ready_pods(core, namespace: str, service: str, count: int) -> list[client.V1Pod]:
    def ready() -> list[client.V1Pod]:
        return [p for p in engine_pods(core, namespace, service) if is_ready(p)]

    wait_until(lambda: len(ready()) >= count, READY_TIMEOUT, f"{count} Ready pods of {service}")
    return ready()


def install_gateway(
    cluster, namespace: str, watched: tuple[str, ...] = (), values: tuple[str, ...] = (),
    replicas: int = 1,
) -> tuple[str, str]:  # fmt: skip
    """A release of the chart with only the gateway on, in `namespace`, serving it and the
    `watched` namespaces, with more `--set` `values`; returns the release name and the
    (first) gateway pod's metrics URL (the operator reads it from the host)."""
    served = ",".join((namespace, *watched))
    name = f"gw{uuid.uuid4().hex[:5]}"
    repository, tag = image_ref("gateway").removeprefix("docker.io/").rsplit(":", 1)
    done = helm(
        cluster, "install", name, str(CHART), "--namespace", namespace, "--skip-crds",
        "--set", "operator.enabled=false", "--set", "scheduler.enabled=false",
        "--set", "devicePlugin.enabled=false", "--set", "admissionPolicy.enabled=false",
        "--set", "priorityClasses.create=false",
        "--set", f"gateway.image.repository={repository}", "--set", f"gateway.image.tag={tag}",
        "--set", f"gateway.replicas={replicas}",
        "--set", f"gateway.watchNamespaces={{{served}}}",
        "--set", f"gateway.apiKeysSecret.name={KEYS}",
        "--set", "gateway.holdTimeoutSeconds=600",
        *(arg for value in values for arg in ("--set", value)),
        "--wait", "--timeout", "300s",
    )  # fmt: skip
    if done.returncode != 0:
        helm(cluster, "uninstall", name, "--namespace", namespace, "--wait")
        pytest.fail(f"helm install of the gateway: {done.stderr}")
    core = client.CoreV1Api(cluster.api)
    pods = core.list_namespaced_pod(
        namespace, label_selector=f"app.kubernetes.io/instance={name}"
    ).items
    assert len(pods) == replicas and all(is_ready(p) for p in pods)
    return name, f"http://{pods[0].status.pod_ip}:9090/metrics"


def gateway_namespace(
    cluster, prefix: str, values: tuple[str, ...] = (), replicas: int = 1
) -> tuple[str, str, str]:
    """A fresh namespace named after `prefix`, holding the sample keys Secret and a gateway
    release serving it (install_gateway's); returns the namespace, the release and the
    gateway's metrics URL. The namespace is deleted again if the install fails."""
    core = client.CoreV1Api(cluster.api)
    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        kubectl(cluster.kubeconfig, "apply", "-n", namespace, "-f",
                str(GATEWAY_SAMPLES / "api-keys.yaml"))  # fmt: skip
        release, metrics_url = install_gateway(cluster, namespace, values=values,
                                               replicas=replicas)  # fmt: skip
    except BaseException:
        core.delete_namespace(namespace)
        raise
    return namespace, release, metrics_url


def engine_metrics(pod: client.V1Pod, port: int = DEFAULT_PORT) -> str:
    """The text of the pod's engine's /metrics (this machine reaches the node's pod IPs), on
    its runtime's `port`."""
    with urllib.request.urlopen(f"http://{pod.status.pod_ip}:{port}/metrics", timeout=10) as r:
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


@contextmanager
def scratch_namespaces(core: client.CoreV1Api, *prefixes: str) -> Iterator[list[str]]:
    """Fresh namespaces, one per prefix with a shared random suffix, deleted at the end
    (one already gone, say deleted by a test, is fine)."""
    run = uuid.uuid4().hex[:5]
    names = [f"{prefix}-{run}" for prefix in prefixes]
    for name in names:
        core.create_namespace({"metadata": {"name": name}})
    try:
        yield names
    finally:
        for name in names:
            try:
                core.delete_namespace(name)
            except ApiException as err:
                if err.status != 404:
                    raise
