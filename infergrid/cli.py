"""The ``infergrid`` command: look at a fleet file or a pod's GPU request without a cluster,
or replay a trace through the placement core (``simulate``).

Bad input prints ``error: <field>: <reason>`` and exits 2, never a traceback.
"""

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

from infergrid import __version__
from infergrid.errors import ContractError
from infergrid.fleet import FleetNode, load_fleet
from infergrid.inventory import node_capacity
from infergrid.pod_request import parse_pod_request
from infergrid.simulate import cli as simulate_cli
from infergrid.yamlfile import read_yaml

EXIT_BAD_INPUT: Final = 2
_FLEET_COLUMNS: Final = ("NODE", "MODEL", "GPUS", "MEMORY_MIB", "CAPACITY")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; the exit status is 0, or 2 for bad input."""
    args = _parser().parse_args(argv)
    try:
        print(args.run(args))
    except ContractError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
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
