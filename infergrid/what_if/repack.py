"""What a re-pack would move to free whole nodes: a plan, never carried out.

From the cluster as it is, each node that only the GPU pods hold (once they
are gone nothing is held there: no pod that stays, no foreign use) is tried in
turn, the fewest pods first: its pods replay, in creation order, onto the other
nodes that hold something then (through the simulator's replay, as every
what-if placement does; a free node would only be traded for this one). If
every one of them fits, the moves are kept and the node is freed; if not,
nothing of that try is kept. A node that took pods is not emptied later, so no
pod moves twice, and pods on nodes that stay are not touched: the plan moves
only what frees a node.

The learning policies read the typical pods of the whole cluster here: a few
pods of one node would teach them little.
"""

from dataclasses import dataclass

from infergrid.placement import NodeState
from infergrid.simulate.policies import SimPolicy
from infergrid.what_if.live import LiveCluster, LivePod
from infergrid.what_if.measures import Measures, is_free, measure
from infergrid.what_if.outcome import replay_in_order


@dataclass(frozen=True, slots=True)
class Move:
    """One pod the plan moves, from the node it holds GPUs on now to another."""

    pod: str
    source: str
    target: str


@dataclass(frozen=True, slots=True)
class Repack:
    """The moves under ``policy``, the nodes they free, and the cluster's measures after them."""

    policy: str
    moves: tuple[Move, ...]
    freed: tuple[str, ...]
    after: Measures


def plan(cluster: LiveCluster, policy: SimPolicy) -> Repack:
    """The re-pack of the cluster under ``policy`` (see the module)."""
    nodes = {n.name: n for n in cluster.now}
    vacated = {n.name: n for n in cluster.vacated}
    holding: dict[str, list[LivePod]] = {}
    for pod in cluster.pods:
        if pod.node in nodes:
            holding.setdefault(pod.node, []).append(pod)
    tries = sorted(
        (name for name in holding if is_free(vacated[name])),
        key=lambda name: (len(holding[name]), _held_mib(nodes[name]), name),
    )
    moves: list[Move] = []
    freed: list[str] = []
    took: set[str] = set()
    for source in tries:
        if source in took:
            continue
        targets = [n for name, n in nodes.items() if name != source and not is_free(n)]
        pods = holding[source]
        played = replay_in_order(targets, [p.pod for p in pods], cluster.typical, policy, False)
        landed = [node for node in played.placed_on if node is not None]
        if len(landed) < len(pods):
            continue
        nodes.update((n.name, n) for n in played.nodes)
        nodes[source] = vacated[source]
        moves += (Move(p.key, source, node) for p, node in zip(pods, landed, strict=True))
        took.update(landed)
        freed.append(source)
    after = measure(list(nodes.values()), cluster.typical)
    return Repack(policy.name, tuple(moves), tuple(freed), after)


def _held_mib(node: NodeState) -> int:
    return sum(g.held_mib for g in node.gpus)
