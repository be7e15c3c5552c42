"""Pods for the real node: a shell in an image built here, and waiting on what it does."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kubernetes import client

from e2e.cluster import model_store
from e2e.cluster.node_configs import REAL_NODE_LABEL
from e2e.cluster.node_images import image_ref
from e2e.cluster.processes import wait_until
from e2e.identities import Identities
from e2e.operator_support import OperatorProcess, delete_every_service, free_port
from images import cluster_binaries

__all__ = [
    "REAL_NODE_LABEL",
    "logs_of",
    "port_forward",
    "real_node_name",
    "shell_pod",
    "wait_phase",
]


def shell_pod(
    name: str, script: str, limits: dict[str, str] | None = None, scheduler: str | None = None
) -> dict:
    """A pod on the real node that runs `script` under sh, as a non-root user."""
    spec: dict = {
        "nodeSelector": {REAL_NODE_LABEL: "true"},
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 2,
        "automountServiceAccountToken": False,
        "containers": [
            {
                "name": "main",
                "image": image_ref("device-plugin"),
                "command": ["sh", "-c", script],
                "resources": {"limits": limits or {}},
                "securityContext": {
                    "runAsNonRoot": True,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def wait_phase(
    core: client.CoreV1Api, namespace: str, name: str, phase: str, timeout: float = 120
) -> client.V1Pod:
    """Waits for `phase`; a pod that ends in another phase fails at once with its status."""

    def ended_otherwise() -> None:
        status = core.read_namespaced_pod(name, namespace).status
        if status.phase in ("Succeeded", "Failed") and status.phase != phase:
            raise AssertionError(f"pod {namespace}/{name} ended {status.phase}: {status}")

    wait_until(
        lambda: core.read_namespaced_pod(name, namespace).status.phase == phase,
        timeout,
        f"pod {namespace}/{name} to be {phase}",
        ended_otherwise,
    )
    return core.read_namespaced_pod(name, namespace)


def logs_of(core: client.CoreV1Api, namespace: str, name: str) -> str:
    """The pod's log, read through the API server from the real kubelet."""
    return core.read_namespaced_pod_log(name, namespace)


@contextmanager
def port_forward(kubeconfig: Path, namespace: str, target: str, remote: int) -> Iterator[str]:
    """`kubectl port-forward` in the background; yields the local base URL."""
    port = free_port()
    kubectl = str(cluster_binaries.paths()["kubectl"])
    argv = [kubectl, "--kubeconfig", str(kubeconfig), "port-forward",
            "-n", namespace, target, f"{port}:{remote}"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("Forwarding from"), line + proc.stdout.read()
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def real_node_name(core: client.CoreV1Api) -> str:
    """The cluster's real node (there is one per machine)."""
    nodes = core.list_node(label_selector=f"{REAL_NODE_LABEL}=true").items
    assert nodes, "the cluster has no real node"
    return nodes[0].metadata.name


@contextmanager
def serving_namespace(
    api: client.ApiClient, identities: Identities, prefix: str, log: Path, *,
    namespace: str = "", operator_args: tuple[str, ...] = (),
) -> Iterator[str]:  # fmt: skip
    """A namespace served by an operator with the engine images built here, as the chart's
    operator ServiceAccount, holding the model store's claim on the real node (what the pvc://
    samples name): a fresh one named after `prefix`, or `namespace`, made by the caller.
    Deleted at the end either way. The admission policies leave it alone: the real node's
    plugin, which marks its pods allocated, is the cluster's process (e2e/README.md)."""
    core = client.CoreV1Api(api)
    if not namespace:
        namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": namespace}})
    model_store.provide(api, namespace, real_node_name(core))
    kubeconfig = identities.kubeconfig("operator", log.with_suffix(".kubeconfig"))
    runtime_images = json.dumps({"llama.cpp": image_ref("llama-cpp")})
    operator = OperatorProcess(kubeconfig, [namespace], log, "--engine-image", image_ref("engine"),
                               "--runtime-images", runtime_images, *operator_args)  # fmt: skip
    operator.start()
    try:
        yield namespace
    finally:
        delete_every_service(api, namespace)
        operator.stop()
        core.delete_namespace(namespace)
        model_store.withdraw(api, namespace)
