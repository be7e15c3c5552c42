"""Where a burst of replicas lands through the real kube-scheduler: policy kept, or spoiled.

A Deployment's replicas reach kube-scheduler at once. It binds asynchronously, so each pod is
filtered and scored while the bind of the one before may still be on its way; and its stock
score plugins have placement policies of their own (the emptiest node, balanced use, replicas
of one owner spread over nodes). This bench creates Deployments of 4 GiB GPU shares (as the
operator does for an InferenceService) on a fresh local cluster (4 KWOK nodes x 4 L4 GPUs of
24 GiB) and counts the GPUs and nodes their pods land on, under three settings, each a separate
kube-scheduler bound to the same extender:

- stock scoring, no wait: kube-scheduler's default profile, extender `bindWaitSeconds: 0`;
- InferGrid profile, no wait: the placement scorers off (e2e/cluster/components.py);
- InferGrid profile + wait: the extender's filter waits for earlier pods' binds (the default).

binpack wants the fewest GPUs (6 shares fill a 24 GiB GPU), spread a GPU per pod, then nodes.

    .venv/bin/python -m bench.burst_placement [--pods 8] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

from infergrid import constants

FLEET = """version: v1
nodes:
- name: l4
  count: 4
  gpus: {model: NVIDIA L4, count: 4, memoryMiB: 24576, smCount: 58, computeCapability: '8.9'}
"""
SHARE_MIB = 4096
STOCK = "stock-scheduler"
SETTINGS = (  # (label, scheduler name, extender bindWaitSeconds)
    ("stock scoring, no wait", STOCK, 0),
    ("InferGrid profile, no wait", constants.SCHEDULER_NAME, 0),
    ("InferGrid profile + wait", constants.SCHEDULER_NAME, 2),
)


def burst(api, namespace: str, scheduler: str, policy: str, pods: int) -> dict:
    """A Deployment of `pods` replicas, as the operator makes one; the GPUs and nodes its pods
    were bound to."""
    from kubernetes import client

    from e2e.cluster.processes import wait_until
    from e2e.extender_support import assigned_gpus, bound, share_pod

    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    core.create_namespace({"metadata": {"name": namespace}})
    wait_until(lambda: core.read_namespaced_service_account("default", namespace), 60, "the SA")
    annotations = {constants.ANNOTATION_PLACEMENT_POLICY: policy}
    template = share_pod("replica", SHARE_MIB, annotations=annotations)
    template["metadata"] = {"labels": {"app": policy}, "annotations": annotations}
    template["spec"]["schedulerName"] = scheduler
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": policy},
        "spec": {"replicas": pods, "selector": {"matchLabels": {"app": policy}},
                 "template": template},
    })  # fmt: skip

    def names() -> list[str]:
        return [p.metadata.name for p in core.list_namespaced_pod(namespace).items]

    wait_until(lambda: len(names()) == pods and bound(core, namespace, names()), 120,
               f"{namespace} bound")  # fmt: skip
    placed = assigned_gpus(core, namespace)
    gpus = Counter(uuid for _, uuid in placed)
    nodes = {node for node, _ in placed}
    core.delete_namespace(namespace)
    wait_until(lambda: not names(), 120, f"{namespace} gone")
    return {"gpus": len(gpus), "nodes": len(nodes), "most_on_one_gpu": max(gpus.values())}


def run(pods: int, rounds: int) -> list[dict]:
    from e2e.cluster.local_cluster import LocalCluster
    from e2e.extender_support import ExtenderProcess

    work = Path(tempfile.mkdtemp(prefix="infergrid-burst-"))
    (work / "fleet.yaml").write_text(FLEET)
    cluster = LocalCluster(work / "state")
    cluster.up(work / "fleet.yaml")
    rows = []
    try:
        cluster.start_scheduler(STOCK, {"schedulerName": STOCK})
        api = cluster.api()
        for label, scheduler, wait_s in SETTINGS:
            extender = ExtenderProcess(cluster.extender_url(), cluster.kubeconfig,
                                       work / f"extender-{wait_s}.log")  # fmt: skip
            extender.args = ["--bind-wait", str(wait_s)]
            extender.start()
            try:
                for policy in (constants.POLICY_BINPACK, constants.POLICY_SPREAD):
                    runs = [burst(api, f"{policy}-w{wait_s}-{scheduler}-{r}", scheduler,
                                  policy, pods) for r in range(rounds)]  # fmt: skip
                    rows.append({"setting": label, "policy": policy, "pods": pods,
                                 "runs": runs, **medians(runs)})  # fmt: skip
                    print_row(rows[-1])
            finally:
                extender.stop()
    finally:
        cluster.down()
    return rows


def medians(runs: list[dict]) -> dict:
    return {f"median_{k}": statistics.median(r[k] for r in runs) for k in runs[0]}


HEADER = (f"{'setting':<28} {'policy':<8} {'GPUs used':>9} {'nodes used':>10}"
          f" {'most on one GPU':>15}   per round (GPUs/nodes)")  # fmt: skip


def print_row(row: dict) -> None:
    rounds = " ".join(f"{r['gpus']}/{r['nodes']}" for r in row["runs"])
    print(f"{row['setting']:<28} {row['policy']:<8} {row['median_gpus']:>9g}"
          f" {row['median_nodes']:>10g} {row['median_most_on_one_gpu']:>15g}   {rounds}",
          file=sys.stderr, flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=8, help="pods per burst")
    parser.add_argument("--rounds", type=int, default=3, help="bursts per setting and policy")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ideal = -(-args.pods * SHARE_MIB // 24576)
    print(f"{args.pods} shares of {SHARE_MIB} MiB per burst; binpack ideal {ideal} GPU(s) on one"
          f" node, spread ideal {args.pods} GPUs, 1 per GPU", file=sys.stderr)  # fmt: skip
    print(HEADER, file=sys.stderr)
    rows = run(args.pods, args.rounds)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
