"""`infergrid what-if` as a table, or as JSON in the schema below.

The table has a row for the cluster as it is (``now``), one per policy, and one
for the re-pack plan under the best policy; then the plan's moves, the pods that
would not fit, and what could not be read. Columns:

* PLACED, UNFIT: GPU pods that get (hold, for ``now``) their GPUs, and those that
  find no node (hold none);
* MOVED: pods holding GPUs now that the row puts on another node;
* FREE_NODES, FREE_GPUS: nodes nothing holds a GPU of, and GPUs nothing holds;
* STRANDED_MIB: free GPU memory the typical pods cannot use (``measures``);
* FRAG%, UNALLOC%: the simulator's fragmentation rate and unallocated GPU %.

JSON (``--json``)::

    {
      "schema": "infergrid.io/what-if/v1",
      "cluster": {"nodes": int, "gpus": int, "pods": int},
      "now": OUTCOME,
      "policies": [OUTCOME],
      "best": str,
      "repack": {"policy": str, "moves": [{"pod": str, "from": str, "to": str}],
                 "freed_nodes": [str], "after": MEASURES},
      "problems": [str]
    }
    OUTCOME = {"name": str, "placed": int, "unfit": [str], "moved": int,
               "placements": [{"pod": str, "node": str | null}], **MEASURES}
    MEASURES = {"free_nodes": [str], "free_gpus": int, "stranded_mib": float,
                "fragmentation_rate_pct": float, "unallocated_gpu_pct": float}

Pods are ``namespace/name``; placements are in replay order (creation time).
"""

import json
from collections.abc import Sequence
from typing import Any, Final

from infergrid.what_if import WhatIf
from infergrid.what_if.measures import Measures
from infergrid.what_if.outcome import Outcome

SCHEMA: Final = "infergrid.io/what-if/v1"
COLUMNS: Final = (
    "POLICY", "PLACED", "UNFIT", "MOVED", "FREE_NODES", "FREE_GPUS", "STRANDED_MIB", "FRAG%",
    "UNALLOC%",
)  # fmt: skip
_DIGITS: Final = 4


def table(result: WhatIf) -> str:
    """The report as text (see the module)."""
    now, repack = result.now, result.repack
    rows = [
        _row(now.name, now.placed, len(now.unfit), "-", now.measures),
        *(_row(o.name, o.placed, len(o.unfit), str(o.moved), o.measures) for o in result.outcomes),
        _row(f"re-pack ({repack.policy})", now.placed, len(now.unfit), str(len(repack.moves)),
             repack.after),
    ]  # fmt: skip
    lines = [
        _columns([COLUMNS, *rows]),
        f"{result.nodes} GPU nodes, {result.gpus} GPUs, {len(now.placed_on)} GPU pods; "
        f"best: {result.best} (most pods placed, then nodes and GPUs left free, "
        "then least memory stranded)",
        f"re-pack under {repack.policy}: moves {len(repack.moves)} pod(s) and frees "
        f"{len(repack.freed)} node(s); a plan only, nothing was moved",
    ]
    if repack.moves:
        moves = [("POD", "FROM", "TO"), *((m.pod, m.source, m.target) for m in repack.moves)]
        lines.append(_columns(moves, indent="  "))
    lines += [f"unfit under {o.name}: {', '.join(o.unfit)}" for o in result.outcomes if o.unfit]
    lines += [f"unreadable: {p}" for p in result.problems]
    return "\n".join(lines)


def to_json(result: WhatIf) -> dict[str, Any]:
    """The report as the documented JSON document."""
    repack = result.repack
    return {
        "schema": SCHEMA,
        "cluster": {"nodes": result.nodes, "gpus": result.gpus, "pods": len(result.now.placed_on)},
        "now": _outcome_json(result.now),
        "policies": [_outcome_json(o) for o in result.outcomes],
        "best": result.best,
        "repack": {
            "policy": repack.policy,
            "moves": [{"pod": m.pod, "from": m.source, "to": m.target} for m in repack.moves],
            "freed_nodes": list(repack.freed),
            "after": _measures_json(repack.after),
        },
        "problems": list(result.problems),
    }


def dumps(document: dict[str, Any]) -> str:
    """The JSON text: two-space indent, keys in schema order."""
    return json.dumps(document, indent=2)


def _row(name: str, placed: int, unfit: int, moved: str, m: Measures) -> tuple[str, ...]:
    return (
        name,
        str(placed),
        str(unfit),
        moved,
        str(len(m.free_nodes)),
        str(m.free_gpus),
        f"{m.stranded_mib:.0f}",
        f"{m.fragmentation_pct:.2f}",
        f"{m.unallocated_pct:.2f}",
    )


def _columns(rows: Sequence[Sequence[str]], indent: str = "") -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _outcome_json(outcome: Outcome) -> dict[str, Any]:
    return {
        "name": outcome.name,
        "placed": outcome.placed,
        "unfit": list(outcome.unfit),
        "moved": outcome.moved,
        "placements": [{"pod": pod, "node": node} for pod, node in outcome.placed_on],
        **_measures_json(outcome.measures),
    }


def _measures_json(m: Measures) -> dict[str, Any]:
    return {
        "free_nodes": list(m.free_nodes),
        "free_gpus": m.free_gpus,
        "stranded_mib": round(m.stranded_mib, _DIGITS),
        "fragmentation_rate_pct": round(m.fragmentation_pct, _DIGITS),
        "unallocated_gpu_pct": round(m.unallocated_pct, _DIGITS),
    }
