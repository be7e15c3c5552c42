"""The ``infergrid`` command: look at a fleet file or a pod's GPU request without a cluster,
replay a trace through the placement core (``simulate``), or read a cluster: who holds what
(``placements``), what each policy would free (``what-if``), and GPU-hours held against used
over a window of its metrics (``report``).

Bad input prints ``error: <field>: <reason>`` and exits 2, never a traceback.
"""

import argparse
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from infergrid import __version__
from infergrid.constants import PLACEMENT_POLICIES
from infergrid.errors import ContractError
from infergrid.fleet import FleetNode, load_fleet
from infergrid.inventory import node_capacity
from infergrid.pod_request import parse_pod_request
from infergrid.report import cli as report_cli
from infergrid.simulate import cli as simulate_cli
from infergrid.yamlfile import read_yaml

EXIT_BAD_INPUT: Final = 2
_FLEET_COLUMNS: Final = ("NODE", "MODEL", "GPUS", "MEMORY_MIB", "CAPACITY")
_WHAT_IF: Final = """Replays the cluster's GPU pods, in creation order, from empty GPU nodes through
the simulator's replay under each policy, and prints per policy the pods placed and
unfit, the nodes and GPUs left free, the stranded GPU memory, the fragmentation and
unallocated GPU %; then what a re-pack under the best policy would move to free
whole nodes. It only reads the cluster: nothing is moved. --json prints the schema
infergrid.io/what-if/v1 (infergrid/what_if/report.py; docs/placement.md)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; the exit status is 0, or 2 for bad input."""
    args = _parser().parse_args(argv)
    try:
        print(args.run(args))
    except ContractError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `| head` stopped reading: what it took is all that was wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infergrid", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    fleet = commands.add_parser("fleet", help="print the nodes of a fleet file")
    fleet.add_argument("file")
    fleet.set_defaults(run=lambda args: _fleet_table(args.file))
    pod = commands.add_parser("pod-request", help="print a pod's GPU request as JSON")
    pod.add_argument("file", help="the pod as YAML or JSON")
    pod.set_defaults(run=lambda args: _pod_request_json(args.file))
    simulate = commands.add_parser(
        "simulate",
        help="replay a node and pod trace (the FGD paper's openb) under placement policies",
        description=simulate_cli.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    simulate_cli.add_arguments(simulate)
    simulate.set_defaults(run=simulate_cli.run)
    placements = commands.add_parser(
        "placements",
        help="print which pod holds how much of each GPU, and what is free (reads the cluster)",
    )
    placements.add_argument(
        "--stale-after", type=float, default=30.0, metavar="SECONDS",
        help="a node whose usage heartbeat is older offers nothing, as in the extender",
    )  # fmt: skip
    placements.set_defaults(run=lambda args: _placements(args.stale_after))
    replay = commands.add_parser(
        "what-if",
        help="replay the cluster's GPU pods under each policy: what would be freed, and what a "
        "re-pack would move (reads the cluster; moves nothing)",
        description=_WHAT_IF,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    replay.add_argument(
        "--policies", default=",".join(PLACEMENT_POLICIES),
        help=f"comma-separated, or all; default the extender's: {','.join(PLACEMENT_POLICIES)}",
    )  # fmt: skip
    replay.add_argument(
        "--snapshot", metavar="FILE",
        help="read the nodes and pods from FILE (kubectl get nodes,pods -A -o json) instead",
    )  # fmt: skip
    replay.add_argument(
        "--stale-after", type=float, default=30.0, metavar="SECONDS",
        help="a node whose usage heartbeat is older offers nothing, as in the extender; a "
        "snapshot's time is its newest heartbeat",
    )  # fmt: skip
    replay.add_argument("--json", action="store_true", help="print the JSON report")
    replay.set_defaults(run=_what_if)
    report = commands.add_parser(
        "report",
        help="GPU-hours held against used per namespace, service and GPU model, with the "
        "whole-GPU counterfactual and cost (reads Prometheus or a recorded file)",
        description=report_cli.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report_cli.add_arguments(report)
    report.set_defaults(run=report_cli.run)
    version = commands.add_parser("version", help="print the version")
    version.set_defaults(run=lambda args: __version__)
    return parser


def _placements(stale_after_s: float) -> str:
    from infergrid import placement_table
    from infergrid.cluster_snapshot import read_snapshot
    from infergrid.process import kube_api

    snap = read_snapshot(kube_api())
    rows = placement_table.gpu_rows(
        snap.inventories, snap.usages, snap.assignments,
        datetime.now(UTC), timedelta(seconds=stale_after_s),
    )  # fmt: skip
    problems = [f"unreadable: {p}" for p in snap.problems]
    return "\n".join([placement_table.render(rows), *problems])


def _what_if(args: argparse.Namespace) -> str:
    from infergrid.simulate.policies import parse_policies
    from infergrid.what_if import report, what_if
    from infergrid.what_if.live import objects_of

    policies = parse_policies(args.policies)
    if not args.stale_after > 0:
        raise ContractError("stale-after", f"must be above 0 seconds, got {args.stale_after}")
    if args.snapshot:
        nodes, pods = objects_of(read_yaml(args.snapshot), args.snapshot)
        now = None
    else:
        nodes, pods = _cluster_objects()
        now = datetime.now(UTC)
    result = what_if(nodes, pods, policies, now, timedelta(seconds=args.stale_after))
    if args.json:
        return report.dumps(report.to_json(result))
    return report.table(result)


def _cluster_objects() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The cluster's nodes and live pods; a cluster that cannot be read is named, not a
    traceback."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    from infergrid.cluster_snapshot import list_objects
    from infergrid.process import kube_api

    try:
        return list_objects(kube_api())
    except ConfigException as error:
        raise ContractError("kubeconfig", str(error)) from None
    except ApiException as error:
        reason = f"the API server answered {error.status} {error.reason}"
        raise ContractError("cluster", reason) from None
    except HTTPError as error:
        raise ContractError("cluster", f"cannot reach the API server: {error}") from None


def _fleet_table(path: str) -> str:
    rows = [_FLEET_COLUMNS, *(_fleet_row(node) for node in load_fleet(path).nodes)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_FLEET_COLUMNS))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def _fleet_row(node: FleetNode) -> tuple[str, ...]:
    gpus = node.inventory.gpus
    capacity = node_capacity(node.inventory)
    return (
        node.name,
        gpus[0].model,
        str(len(gpus)),
        str(gpus[0].memory_mib),
        ",".join(f"{name}={amount}" for name, amount in capacity.items()),
    )


def _pod_request_json(path: str) -> str:
    request = parse_pod_request(read_yaml(path))
    body = {
        "policy": request.policy,
        "topology": request.topology,
        "containers": [
            {
                "name": c.name,
                "init": c.init,
                "kind": c.kind,
                "gpus": c.gpus,
                "memoryMiB": c.memory_mib,
                "cores": c.cores,
                "migProfile": c.mig_profile,
            }
            for c in request.containers
        ],
    }
    return json.dumps(body, indent=2)
