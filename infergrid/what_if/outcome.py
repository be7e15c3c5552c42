"""Each policy's answer for a live cluster: its GPU pods placed anew, and what that leaves free.

The pods replay through the simulator's own replay (``play``, the loop
``infergrid simulate`` runs, which asks the extender's ``NodeSet`` about every
pod) from the vacated nodes, one attempt each, in creation order, on the nodes
in name order (the first of equally good nodes wins, as in the simulator). The
production policies learn their workload from the pods as they arrive, as the
extender does and as ``infergrid simulate`` does by default. So a cluster and a
trace of the same pods give the same numbers (``tests/test_what_if.py`` holds
them equal). ``now`` is the cluster as it is, measured the same way.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from infergrid.placement import NodeState, Workload
from infergrid.simulate.arrivals import Arrivals
from infergrid.simulate.cluster import SimPod
from infergrid.simulate.policies import SimPolicy
from infergrid.simulate.replay import Played, Scenario, play
from infergrid.what_if.live import LiveCluster
from infergrid.what_if.measures import Measures, measure

SEED: Final = 0
"""The replay's seed: random-fit draws as `infergrid simulate --seeds 0` does."""

NOW: Final = "now"
"""The name of the outcome that is the cluster as it is."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One placement of the GPU pods: where each went (None: it did not fit), in replay
    order, how many of those holding GPUs now went to another node, and the measures."""

    name: str
    placed_on: tuple[tuple[str, str | None], ...]
    moved: int
    measures: Measures

    @property
    def unfit(self) -> tuple[str, ...]:
        """The pods that found no node (now: that hold no GPU)."""
        return tuple(pod for pod, node in self.placed_on if node is None)

    @property
    def placed(self) -> int:
        return len(self.placed_on) - len(self.unfit)


def replay_in_order(
    states: Sequence[NodeState],
    pods: Sequence[SimPod],
    typical: Workload,
    policy: SimPolicy,
    learned: bool = True,
) -> Played:
    """The pods, in the order given, placed on the nodes (first in order wins a tie) by the
    simulator's replay; the learning policies learn unless ``learned`` is False (then they
    read ``typical``)."""
    scenario = Scenario.of_states(states, pods, typical, learned)
    order = Arrivals(SEED, tuple(range(len(states))), tuple(range(len(pods))))
    return play(scenario, policy, order)


def now_outcome(cluster: LiveCluster) -> Outcome:
    """The cluster as it is: each GPU pod on the node its assignment names."""
    placed_on = tuple((p.key, p.node) for p in cluster.pods)
    return Outcome(NOW, placed_on, 0, measure(cluster.now, cluster.typical))


def policy_outcome(cluster: LiveCluster, policy: SimPolicy) -> Outcome:
    """Every GPU pod placed anew under ``policy`` from the vacated nodes."""
    pods = [p.pod for p in cluster.pods]
    played = replay_in_order(cluster.vacated, pods, cluster.typical, policy)
    placed_on = tuple((p.key, node) for p, node in zip(cluster.pods, played.placed_on, strict=True))
    moved = sum(
        1
        for p, node in zip(cluster.pods, played.placed_on, strict=True)
        if p.node is not None and node is not None and node != p.node
    )
    return Outcome(policy.name, placed_on, moved, measure(played.nodes, cluster.typical))
