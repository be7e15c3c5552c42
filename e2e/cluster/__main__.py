"""`python -m e2e.cluster up|down|status|helm-args`: the local cluster from a shell.

    python -m e2e.cluster up --for-chart    # leaves the real node to the Helm chart
    helm install infergrid deploy/helm/infergrid -n infergrid-system --create-namespace \
        $(python -m e2e.cluster helm-args) --wait
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from kubernetes import client

from images import cluster_binaries
from infergrid import constants
from infergrid.errors import ContractError

from .local_cluster import DEFAULT_FLEET, LocalCluster
from .node_images import LOCAL_VALUES, chart_args
from .processes import ClusterError


def node_table(cluster: LocalCluster) -> str:
    """`kubectl get nodes -o wide`, then each node's GPU product and extended resources."""
    kubectl = cluster_binaries.paths()["kubectl"]
    wide = subprocess.run(
        [str(kubectl), f"--kubeconfig={cluster.kubeconfig}", "get", "nodes", "-o", "wide"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows = [("NODE", "GPU PRODUCT", "GPU CAPACITY")]
    for node in client.CoreV1Api(cluster.api()).list_node().items:
        gpu = {k: v for k, v in node.status.capacity.items() if "/" in k}
        product = (node.metadata.labels or {}).get(constants.LABEL_GPU_PRODUCT, "-")
        rows.append((node.metadata.name, product, " ".join(f"{k}={v}" for k, v in gpu.items())))
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    table = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}" for r in rows]
    return wide + "\n" + "\n".join(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build (once) and start the local cluster")
    up.add_argument("--fleet", type=Path, default=DEFAULT_FLEET)
    up.add_argument("--extender-url", help="default: a free port on 127.0.0.1")
    up.add_argument(
        "--for-chart", action="store_true",
        help="start no infergrid-scheduler and no device plugin process for the real node:"
        " the Helm chart's scheduler and DaemonSet take their place",
    )  # fmt: skip
    up.add_argument(
        "--prometheus", action="store_true",
        help="also start a Prometheus that scrapes the cluster (infergrid report reads it)",
    )  # fmt: skip
    sub.add_parser("prometheus-url", help="print where the cluster's Prometheus answers")
    helm_args = sub.add_parser(
        "helm-args", help="print the helm flags that install the chart on the real node"
    )
    helm_args.add_argument("--fleet", type=Path, default=DEFAULT_FLEET)
    sub.add_parser("down", help="stop every process of the local cluster")
    sub.add_parser("status", help="say whether the local cluster runs")
    sub.add_parser("nodes", help="list the nodes with their GPU capacity")
    sub.add_parser("build", help="build the binaries into the cache")
    args = parser.parse_args(argv)
    cluster = LocalCluster()
    try:
        if args.command == "build":
            cluster_binaries.ensure_built()
        elif args.command == "up":
            seconds = cluster.up(args.fleet, args.extender_url, args.for_chart, args.prometheus)
            print(f"local cluster up in {seconds:.1f}s; export KUBECONFIG={cluster.kubeconfig}")
            if url := cluster.prometheus_url():
                print(f"Prometheus: {url} (infergrid report --prometheus {url})")
            if args.for_chart:
                print("the real node waits for the chart: helm install ... $(python -m"
                      " e2e.cluster helm-args)")  # fmt: skip
        elif args.command == "prometheus-url":
            url = cluster.prometheus_url()
            if url is None:
                print("the local cluster runs no Prometheus: make cluster-up PROMETHEUS=1",
                      file=sys.stderr)  # fmt: skip
                return 1
            print(url)
        elif args.command == "helm-args":
            print(" ".join(shlex.quote(a) for a in chart_args(LOCAL_VALUES, args.fleet)))
        elif args.command == "down":
            stopped = cluster.down()
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
            if cluster.leftovers:
                print("left on the machine:\n  " + "\n  ".join(cluster.leftovers), file=sys.stderr)
                return 1
        elif args.command == "status":
            running = cluster.is_running()
            print(f"local cluster {'running' if running else 'not running'} ({cluster.state})")
            return 0 if running else 1
        elif args.command == "nodes":
            if not cluster.is_running():
                raise ClusterError("the local cluster is not running; run make cluster-up")
            print(node_table(cluster))
    except (ClusterError, ContractError, subprocess.CalledProcessError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
