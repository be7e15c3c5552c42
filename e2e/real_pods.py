"""Pods for the real node: a shell in an image built here, and waiting on what it does."""

from __future__ import annotations

from kubernetes import client

from e2e.cluster.node_configs import REAL_NODE_LABEL
from e2e.cluster.node_images import image_ref
from e2e.cluster.processes import wait_until

__all__ = ["REAL_NODE_LABEL", "logs_of", "shell_pod", "wait_phase"]


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
