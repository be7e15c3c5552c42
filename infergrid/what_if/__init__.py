"""``infergrid what-if``: the live cluster's GPU pods replayed under each policy, and what would
be freed. It only reads; nothing in the cluster moves.

``live`` reads the nodes and pods (Kubernetes JSON) into the replay's types,
``outcome`` replays them under each policy through the simulator's own replay,
``measures`` says what each placement leaves free, ``repack`` plans the moves
that would free whole nodes under the best policy, and ``report`` prints it all.
``what_if`` runs the lot; it is pure, so the CLI only lists the objects.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from infergrid.simulate.policies import SIM_POLICIES, SimPolicy
from infergrid.what_if.live import cluster_of
from infergrid.what_if.outcome import Outcome, now_outcome, policy_outcome
from infergrid.what_if.repack import Repack, plan


@dataclass(frozen=True, slots=True)
class WhatIf:
    """The cluster as it is, each policy's outcome, the best of them and its re-pack plan, and
    what could not be read. ``nodes`` and ``gpus`` count the GPU nodes replayed onto."""

    nodes: int
    gpus: int
    now: Outcome
    outcomes: tuple[Outcome, ...]
    best: str
    repack: Repack
    problems: tuple[str, ...]


def what_if(
    nodes: Iterable[dict[str, Any]],
    pods: Iterable[dict[str, Any]],
    policies: Sequence[SimPolicy],
    now: datetime | None,
    stale_after: timedelta,
) -> WhatIf:
    """The what-if of the cluster the node and pod JSON describe (``now``: see ``cluster_of``).
    The best policy places the most pods, then frees the most nodes, then GPUs, then strands
    the least memory; the first of equals in ``policies`` wins."""
    cluster = cluster_of(nodes, pods, now, stale_after)
    outcomes = tuple(policy_outcome(cluster, p) for p in policies)
    best = min(outcomes, key=_rank).name
    return WhatIf(
        nodes=len(cluster.now),
        gpus=sum(len(n.gpus) for n in cluster.now),
        now=now_outcome(cluster),
        outcomes=outcomes,
        best=best,
        repack=plan(cluster, SIM_POLICIES[best]),
        problems=cluster.problems,
    )


def _rank(outcome: Outcome) -> tuple[int, int, int, float]:
    m = outcome.measures
    return (len(outcome.unfit), -len(m.free_nodes), -m.free_gpus, m.stranded_mib)
