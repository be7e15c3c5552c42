"""Fit and score a pod on many nodes: the one loop the extender and the simulator share.

Work done per pod (resolving the policy, the workload) happens before the loop;
per node it is one fit and, when the pod fits, one raw score. Normalising is a
separate pass over the feasible nodes only.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from infergrid.placement.fit import FitResult, fit
from infergrid.placement.host import HostRequest
from infergrid.placement.policy import Policy
from infergrid.placement.scoring import normalize_scores
from infergrid.placement.state import NodeState
from infergrid.pod_request import PodGpuRequest


@dataclass(frozen=True, slots=True)
class NodeScore:
    """One node's verdict: its fit, raw score and 0–10 score (None and 0 when it does not fit)."""

    node: str
    fit: FitResult
    raw: float | None
    score: int


def score_nodes(
    request: PodGpuRequest,
    nodes: Iterable[NodeState],
    policy: Policy,
    host: HostRequest | None = None,
) -> tuple[NodeScore, ...]:
    """Every node's fit and score for ``request`` (with ``host``, see ``fit``), in order given."""
    fits = [(node, fit(request, node, policy, host)) for node in nodes]
    raw = [
        policy.raw_score(node, result.after, policy.workload)
        for node, result in fits
        if result.after is not None and result.fits
    ]
    scores = iter(normalize_scores(raw))
    raws = iter(raw)
    return tuple(
        NodeScore(node.name, result, next(raws), next(scores))
        if result.fits
        else NodeScore(node.name, result, None, 0)
        for node, result in fits
    )


def best_node(scored: Sequence[NodeScore]) -> NodeScore | None:
    """The feasible node with the highest raw score, ties to the first name: for simulators,
    which need one answer and not the extender's coarse 0–10."""
    feasible = [s for s in scored if s.raw is not None]
    if not feasible:
        return None
    return min(feasible, key=lambda s: (-(s.raw or 0.0), s.node))
