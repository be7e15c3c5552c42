"""`python -m e2e.cluster up|down|status`: the local cluster from a shell."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from kubernetes import client

from infergrid import constants
from infergrid.errors import ContractError

from . import binaries
from .local_cluster import DEFAULT_FLEET, LocalCluster
from .processes import ClusterError


def node_table(cluster: LocalCluster) -> str:
    """`kubectl get nodes -o wide`, then each node's GPU product and extended resources."""
    kubectl = binaries.paths()["kubectl"]
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
    sub.add_parser("down", help="stop every process of the local cluster")
    sub.add_parser("status", help="say whether the local cluster runs")
    sub.add_parser("nodes", help="list the nodes with their GPU capacity")
    sub.add_parser("build", help="build the binaries into the cache")
    args = parser.parse_args(argv)
    cluster = LocalCluster()
    try:
        if args.command == "build":
            binaries.ensure_built()
        elif args.command == "up":
            seconds = cluster.up(args.fleet, args.extender_url)
            print(f"local cluster up in {seconds:.1f}s; export KUBECONFIG={cluster.kubeconfig}")
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
