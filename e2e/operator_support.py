"""Helpers for the operator's e2e tests and bench: the operator process, objects, waits."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from kubernetes import client

from e2e.cluster.fake_nodes import KWOK_NODE_SELECTOR, KWOK_TOLERATION
from e2e.cluster.processes import wait_until
from e2e.part_process import PartProcess
from images import cluster_binaries
from infergrid.constants import CRD_GROUP, CRD_PLURAL, CRD_VERSION

SAMPLES = Path(__file__).resolve().parents[1] / "deploy" / "samples"
SERVICE_LABEL = "infergrid.io/inferenceservice"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OperatorProcess(PartProcess):
    """`python -m inference_operator.main` scoped to some namespaces."""

    def __init__(self, kubeconfig: Path, namespaces: list[str], log: Path, *args: str):
        self.port = free_port()
        super().__init__("operator", kubeconfig, log, f"http://127.0.0.1:{self.port}/healthz")
        self.namespaces = namespaces
        self.args = args

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "inference_operator.main",
            "--namespaces", ",".join(self.namespaces),
            "--liveness-endpoint", self.ready_url,
            *self.args,
        ]  # fmt: skip


def on_kwok(body: dict) -> dict:
    """The InferenceService with its pods on the fake fleet, where only the placement is real:
    they tolerate KWOK's taint and ask for a KWOK node."""
    scheduling = body["spec"].setdefault("scheduling", {})
    scheduling["tolerations"] = [*scheduling.get("tolerations", []), KWOK_TOLERATION]
    scheduling["nodeSelector"] = {**scheduling.get("nodeSelector", {}), **KWOK_NODE_SELECTOR}
    return body


# No engine listens in KWOK pods; a closed local port fails their scrapes at once.
NO_METRICS = ("--metrics-url-template", "http://127.0.0.1:1/{pod_name}")

# A label on the KWOK nodes one test makes, so that its services' pods go only there.
POOL_LABEL = "infergrid.io/e2e-pool"


def in_pool(body: dict, pool: str) -> dict:
    """The InferenceService on KWOK, and only on the nodes labelled with ``pool``."""
    body = on_kwok(body)
    body["spec"]["scheduling"]["nodeSelector"][POOL_LABEL] = pool
    return body


def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def create_service(api: client.ApiClient, namespace: str, body: dict) -> None:
    custom(api).create_namespaced_custom_object(CRD_GROUP, CRD_VERSION, namespace, CRD_PLURAL, body)


def read_service(api: client.ApiClient, namespace: str, name: str) -> dict:
    return custom(api).get_namespaced_custom_object(
        CRD_GROUP, CRD_VERSION, namespace, CRD_PLURAL, name
    )


def delete_service(api: client.ApiClient, namespace: str, name: str) -> None:
    custom(api).delete_namespaced_custom_object(CRD_GROUP, CRD_VERSION, namespace, CRD_PLURAL, name)


def delete_every_service(api: client.ApiClient, namespace: str) -> None:
    """Deletes the namespace's InferenceServices and waits until they are gone. Call it while
    the operator still runs: a service carries kopf's finalizer, which only a running
    operator removes; left behind, it would hold the namespace in Terminating."""

    def listed() -> list[dict]:
        found = custom(api).list_namespaced_custom_object(
            CRD_GROUP, CRD_VERSION, namespace, CRD_PLURAL
        )
        return found["items"]

    for item in listed():
        try:
            delete_service(api, namespace, item["metadata"]["name"])
        except client.ApiException as err:
            if err.status != 404:
                raise
    wait_until(lambda: not listed(), 60, f"the InferenceServices of {namespace} deleted")


def condition(api: client.ApiClient, namespace: str, name: str, kind: str) -> dict:
    status = read_service(api, namespace, name).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def events(api: client.ApiClient, namespace: str, name: str, reason: str) -> list[str]:
    """Messages of the InferenceService's events with this reason."""
    found = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},reason={reason}"
    )
    return [e.message for e in found.items if e.involved_object.kind == "InferenceService"]


def turned_ready(api: client.ApiClient, namespace: str, name: str) -> bool:
    """Ready now, or the operator's Ready event says it was.

    The local cluster's KWOK nodes miss heartbeats now and then, and the node
    controller then marks their pods NotReady, which no kubelet undoes; the
    event keeps a Ready that such a blip took away afterwards.
    """
    if condition(api, namespace, name, "Ready").get("status") == "True":
        return True
    return bool(events(api, namespace, name, "Ready"))


def owned(api: client.ApiClient, namespace: str, name: str) -> dict[str, list]:
    """The service's children by kind, found by its label."""
    selector = f"{SERVICE_LABEL}={name}"
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    policy = client.PolicyV1Api(api)
    return {
        "ConfigMap": core.list_namespaced_config_map(namespace, label_selector=selector).items,
        "Deployment": apps.list_namespaced_deployment(namespace, label_selector=selector).items,
        "Service": core.list_namespaced_service(namespace, label_selector=selector).items,
        "PodDisruptionBudget": policy.list_namespaced_pod_disruption_budget(
            namespace, label_selector=selector
        ).items,
        "ReplicaSet": apps.list_namespaced_replica_set(namespace, label_selector=selector).items,
        "Pod": [
            p
            for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            if not p.metadata.deletion_timestamp
        ],
    }


def container_statuses(pod: client.V1Pod) -> list[client.V1ContainerStatus]:
    """Every container's status, native sidecars (init containers that keep running, as the
    extender beside kube-scheduler) too."""
    status = pod.status
    return [*(status.container_statuses or []), *(status.init_container_statuses or [])]


def all_bound(api: client.ApiClient, namespace: str, name: str, replicas: int) -> bool:
    """Whether the service has exactly ``replicas`` live pods, every one bound to a node."""
    pods = owned(api, namespace, name)["Pod"]
    return len(pods) == replicas and all(p.spec.node_name for p in pods)


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    """The pinned kubectl of the local cluster, else one on PATH."""
    binary = cluster_binaries.paths()["kubectl"]
    command = str(binary) if binary.exists() else "kubectl"
    done = subprocess.run(
        [command, "--kubeconfig", str(kubeconfig), *args],
        input=stdin, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr}")
    return done.stdout
