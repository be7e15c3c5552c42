"""Where a burst of replicas lands through the real kube-scheduler, and at what pods/s.

A Deployment's replicas reach kube-scheduler at once. It binds asynchronously, so each pod is
filtered and scored while the bind of the one before may still be on its way; and its stock
score plugins have placement policies of their own (the emptiest node, balanced use, replicas
of one owner spread over nodes). This bench creates Deployments of 4 GiB GPU shares (as the
operator does for an InferenceService) on a fresh local cluster (4 KWOK nodes x 4 L4 GPUs of
24 GiB) and counts the GPUs and nodes their pods land on, under four settings, each a separate
kube-scheduler bound to the same extender:

- stock scoring: kube-scheduler's default profile, the extender neither waits nor holds;
- InferGrid profile, neither: the placement scorers off (e2e/cluster/components.py);
- InferGrid profile + wait: the extender's filter waits for earlier pods' binds
  (`bindWaitSeconds: 2`, `tentativeReservationSeconds: 0`);
- InferGrid profile + tentative reservations: prioritize holds each pod's placement until its
  bind (`tentativeReservationSeconds: 10`, `bindWaitSeconds: 0`; the default).

binpack wants the fewest GPUs (6 shares fill a 24 GiB GPU), spread a GPU per pod, then nodes.

Then HAMi#1367's shape (a 40-pod job of shares across a few nodes, which HAMi's per-node lock
took 15-30 minutes to schedule): `--job-pods` replicas of one Deployment, through the real
kube-scheduler and the extender as installed (tentative reservations), timed from the
Deployment's creation to the last pod bound (a pods watch; an upper bound), with every pod's
assignment checked: no GPU holds more shares than fit. The goal is 5 s.

Then, in the same run, what each costs in pods/s: `--throughput-nodes` more KWOK nodes of 8
idle GPUs, and `--throughput-pods` gated whole-GPU pods released at once, bound by the default
kube-scheduler alone, then by infergrid-scheduler through the extender with the wait, with
tentative reservations, and with neither; each rate and its ratio to kube-scheduler alone.

    .venv/bin/python -m bench.burst_placement [--pods 8] [--rounds 3] [--job-pods 40]
        [--throughput-nodes 1000] [--throughput-pods 500] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infergrid import constants

FLEET = """version: v1
nodes:
- name: l4
  count: 4
  gpus: {model: NVIDIA L4, count: 4, memoryMiB: 24576, smCount: 58, computeCapability: '8.9'}
"""
SHARE_MIB = 4096
L4_MIB = 24576
JOB_GOAL_S = 5.0
STOCK = "stock-scheduler"
NEITHER = ["--bind-wait", "0", "--tentative-reservation", "0"]
WAIT = ["--bind-wait", "2", "--tentative-reservation", "0"]
HOLDS = ["--bind-wait", "0", "--tentative-reservation", "10"]
SETTINGS = (  # (label, scheduler name, extender flags)
    ("stock scoring, neither", STOCK, NEITHER),
    ("InferGrid profile, neither", constants.SCHEDULER_NAME, NEITHER),
    ("InferGrid profile + wait", constants.SCHEDULER_NAME, WAIT),
    ("InferGrid profile + tentative", constants.SCHEDULER_NAME, HOLDS),
)
THROUGHPUT = (  # (namespace, label, extender flags); None: kube-scheduler alone
    ("alone", "kube-scheduler alone", None),
    ("wait", "extender + wait", WAIT),
    ("tentative", "extender + tentative reservations", HOLDS),
    ("neither", "extender, neither", NEITHER),
)
THROUGHPUT_GPUS = {"model": "NVIDIA L4", "count": 8, "memoryMiB": 23034, "smCount": 58,
                   "computeCapability": "8.9"}  # fmt: skip


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


def job(api, namespace: str, pods: int, timeout_s: float = 120.0) -> dict:
    """HAMi#1367's shape: one Deployment of `pods` shares, created at once; seconds from its
    creation to the last pod bound (each bind seen on a pods watch opened at the namespace's
    version before the creation: events already past when it opens count as seen then, so
    the time is an upper bound), and the GPUs the pods were assigned."""
    from kubernetes import client, watch

    from e2e.cluster.processes import wait_until
    from e2e.extender_support import assigned_gpus, share_pod

    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    core.create_namespace({"metadata": {"name": namespace}})
    wait_until(lambda: core.read_namespaced_service_account("default", namespace), 60, "the SA")
    template = share_pod("member", SHARE_MIB)
    template["metadata"] = {"labels": {"app": "job"}}
    version = core.list_namespaced_pod(namespace).metadata.resource_version
    started = time.perf_counter()
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "job"},
        "spec": {"replicas": pods, "selector": {"matchLabels": {"app": "job"}},
                 "template": template},
    })  # fmt: skip
    bound_at = bind_times(core, watch.Watch(), namespace, version, started, pods, timeout_s)
    placed = assigned_gpus(core, namespace)
    shares = Counter(uuid for _, uuid in placed)
    core.delete_namespace(namespace)
    return {
        "pods": pods,
        "bound": len(bound_at),
        "seconds": round(max(bound_at.values()), 2) if len(bound_at) == pods else None,
        "gpus": len(shares),
        "nodes": len({node for node, _ in placed}),
        "most_on_one_gpu": max(shares.values(), default=0),
        "overcommitted_gpus": sum(n * SHARE_MIB > L4_MIB for n in shares.values()),
    }


def bind_times(core, watcher, namespace: str, version: str, started: float, pods: int,
               timeout_s: float) -> dict[str, float]:  # fmt: skip
    """Seconds after `started` at which each pod was first seen bound, until `pods` are."""
    bound_at: dict[str, float] = {}
    events = watcher.stream(core.list_namespaced_pod, namespace, resource_version=version,
                            timeout_seconds=int(timeout_s))  # fmt: skip
    for event in events:
        pod = event["object"]
        if pod.spec.node_name and pod.metadata.name not in bound_at:
            bound_at[pod.metadata.name] = time.perf_counter() - started
            if len(bound_at) == pods:
                watcher.stop()
    return bound_at


def run_job(cluster, work: Path, pods: int) -> dict | None:
    """The job through the extender as installed (tentative reservations); None for 0 pods."""
    if not pods:
        return None
    with extender(cluster, work / "extender-job.log", HOLDS):
        row = job(cluster.api(), "job", pods)
    seconds = "not all bound" if row["seconds"] is None else f"{row['seconds']:g} s"
    print(f"\n{pods} shares of {SHARE_MIB} MiB in one Deployment (HAMi#1367's shape): "
          f"{row['bound']} bound in {seconds} (goal <= {JOB_GOAL_S:g} s); {row['gpus']} GPUs"
          f" on {row['nodes']} nodes, at most {row['most_on_one_gpu']} on one GPU,"
          f" {row['overcommitted_gpus']} GPUs overcommitted",
          file=sys.stderr, flush=True)  # fmt: skip
    return row


def run(pods: int, rounds: int, job_pods: int, throughput_nodes: int, throughput_pods: int) -> dict:
    from e2e.cluster.local_cluster import LocalCluster

    work = Path(tempfile.mkdtemp(prefix="infergrid-burst-"))
    (work / "fleet.yaml").write_text(FLEET)
    cluster = LocalCluster(work / "state")
    cluster.up(work / "fleet.yaml")
    try:
        cluster.start_scheduler(STOCK, {"schedulerName": STOCK})
        bursts = placement(cluster, work, pods, rounds) if rounds else []
        together = run_job(cluster, work, job_pods)
        rates = throughput(cluster, work, throughput_nodes, throughput_pods)
    finally:
        cluster.down()
    return {"bursts": bursts, "job": together, "throughput": rates}


def placement(cluster, work: Path, pods: int, rounds: int) -> list[dict]:
    """Each setting's bursts, binpack and spread, `rounds` of each."""
    api = cluster.api()
    rows = []
    for at, (label, scheduler, flags) in enumerate(SETTINGS):
        with extender(cluster, work / f"extender-{at}.log", flags):
            for policy in (constants.POLICY_BINPACK, constants.POLICY_SPREAD):
                runs = [burst(api, f"{policy}-{at}-{r}", scheduler, policy, pods)
                        for r in range(rounds)]  # fmt: skip
                rows.append({"setting": label, "policy": policy, "pods": pods,
                             "runs": runs, **medians(runs)})  # fmt: skip
                print_row(rows[-1])
    return rows


def throughput(cluster, work: Path, nodes: int, pods: int) -> list[dict]:
    """Pods/s of each THROUGHPUT setting on `nodes` more nodes, and its ratio to kube-scheduler
    alone; nothing when `nodes` is 0."""
    from kubernetes import client

    from e2e.extender_support import idle_nodes

    if not nodes:
        return []
    api = cluster.api()
    core = client.CoreV1Api(api)
    rows: list[dict] = []
    alone = 0.0  # the first setting's rate
    with idle_nodes(api, [{"name": "rate", "count": nodes, "gpus": THROUGHPUT_GPUS}]):
        print(f"\n{'pods/s of ' + str(pods) + ' pods on ' + str(nodes) + ' nodes':<36}"
              f" {'pods/s':>7} {'ratio':>6}", file=sys.stderr)  # fmt: skip
        for namespace, label, flags in THROUGHPUT:
            if flags is None:
                rate = release_and_time(core, namespace, pods, None)
            else:
                # Heartbeats are published once: they must not go stale during the run.
                with extender(cluster, work / f"rate-{namespace}.log",
                              [*flags, "--stale-after", "3600"]):  # fmt: skip
                    rate = release_and_time(core, namespace, pods, True)
            alone = alone or rate
            rows.append({"setting": label, "nodes": nodes, "pods": pods,
                         "pods_per_s": round(rate, 1),
                         "ratio": round(rate / alone, 3)})  # fmt: skip
            print(f"{label:<36} {rows[-1]['pods_per_s']:>7g} {rows[-1]['ratio']:>6g}",
                  file=sys.stderr, flush=True)  # fmt: skip
    return rows


def release_and_time(core, namespace: str, pods: int, extender: bool | None) -> float:
    """Pods/s from un-gating `pods` whole-GPU pods at once (through infergrid-scheduler
    where `extender`) to the last one bound, as a pods watch sees the binds: polling a list
    of them would take from the two cores the control plane it measures runs on."""
    from kubernetes import watch

    from e2e.cluster.fake_nodes import KWOK_TOLERATION
    from e2e.cluster.processes import wait_until

    core.create_namespace({"metadata": {"name": namespace}})
    wait_until(lambda: core.read_namespaced_service_account("default", namespace), 60, "the SA")
    names = [f"p-{i:04d}" for i in range(pods)]
    limits = {constants.RESOURCE_GPU: "1"}
    for name in names:
        container = {"name": "c", "image": "x", "resources": {"limits": limits}}
        spec = {"schedulingGates": [{"name": "bench"}], "tolerations": [KWOK_TOLERATION],
                "containers": [container]}  # fmt: skip
        if extender:
            spec["schedulerName"] = constants.SCHEDULER_NAME
        core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": spec})
    version = core.list_namespaced_pod(namespace).metadata.resource_version
    started = time.perf_counter()
    for name in names:
        core.patch_namespaced_pod(name, namespace, {"spec": {"schedulingGates": None}})
    bound_at = bind_times(core, watch.Watch(), namespace, version, started, pods, 900)
    if len(bound_at) < pods:
        raise RuntimeError(f"{namespace}: {len(bound_at)} of {pods} pods bound in 900 s")
    return pods / max(bound_at.values())


@contextmanager
def extender(cluster, log: Path, flags: list[str]) -> Iterator[None]:
    """The extender with `flags`, at the URL the cluster's schedulers call, while inside."""
    from e2e.extender_support import BENCH_LEASE, ExtenderProcess

    process = ExtenderProcess(cluster.extender_url(), cluster.kubeconfig, log, BENCH_LEASE)
    process.args = flags
    process.start()
    try:
        yield
    finally:
        process.stop()


def medians(runs: list[dict]) -> dict:
    return {f"median_{k}": statistics.median(r[k] for r in runs) for k in runs[0]}


HEADER = (f"{'setting':<30} {'policy':<8} {'GPUs used':>9} {'nodes used':>10}"
          f" {'most on one GPU':>15}   per round (GPUs/nodes)")  # fmt: skip


def print_row(row: dict) -> None:
    rounds = " ".join(f"{r['gpus']}/{r['nodes']}" for r in row["runs"])
    print(f"{row['setting']:<30} {row['policy']:<8} {row['median_gpus']:>9g}"
          f" {row['median_nodes']:>10g} {row['median_most_on_one_gpu']:>15g}   {rounds}",
          file=sys.stderr, flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=8, help="pods per burst")
    parser.add_argument(
        "--rounds", type=int, default=3, help="bursts per setting and policy (0: skip them)"
    )
    parser.add_argument(
        "--job-pods", type=int, default=40, help="replicas of the timed job (0: skip it)"
    )
    parser.add_argument(
        "--throughput-nodes", type=int, default=1000, help="nodes of the pods/s part (0: skip it)"
    )
    parser.add_argument("--throughput-pods", type=int, default=500,
                        help="pods released at once per pods/s setting")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ideal = -(-args.pods * SHARE_MIB // 24576)
    print(f"{args.pods} shares of {SHARE_MIB} MiB per burst; binpack ideal {ideal} GPU(s) on one"
          f" node, spread ideal {args.pods} GPUs, 1 per GPU", file=sys.stderr)  # fmt: skip
    print(HEADER, file=sys.stderr)
    result = run(args.pods, args.rounds, args.job_pods, args.throughput_nodes, args.throughput_pods)
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
