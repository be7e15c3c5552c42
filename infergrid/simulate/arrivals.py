"""The paper's replay order as one seed's arrivals: which nodes, in which order, and which pods
arrive when.

Per seed (the README of ``shared/traces/openb``, "How the simulator replays"):

1. the nodes are shuffled;
2. the pods are sorted by name, then shuffled;
3. workload inflation: while the total GPU request is below ``inflation`` × the
   cluster's GPUs (130%), a pod drawn from the trace with replacement is
   appended (the last one may pass the target); a trace already above it
   instead loses pods drawn at random until it is not (the paper's tune-down);
4. each pod then gets one scheduling attempt, in that order, and none departs.

All draws come from one ``random.Random(seed)``, in that order, so a seed
always gives the same arrivals whatever the policy.
"""

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from infergrid.errors import ContractError
from infergrid.simulate.cluster import SimPod
from infergrid.simulate.trace import TracePod

DEFAULT_INFLATION: Final = 1.3
"""Pods arrive until their GPU request is 130% of the cluster's GPUs, as in the paper."""


@dataclass(frozen=True, slots=True)
class Arrivals:
    """One seed's replay order: node positions and the pods (indices into the trace) in turn."""

    seed: int
    node_order: tuple[int, ...]
    pods: tuple[int, ...]


def arrivals(
    node_count: int,
    pods: Sequence[TracePod] | Sequence[SimPod],
    capacity_milli: int,
    seed: int,
    inflation: float = DEFAULT_INFLATION,
) -> Arrivals:
    """The node order and pod arrivals of ``seed`` (see the module's steps)."""
    if inflation <= 0:
        raise ContractError("inflation", f"must be above 0, got {inflation}")
    rng = random.Random(seed)
    nodes = list(range(node_count))
    rng.shuffle(nodes)
    order = sorted(range(len(pods)), key=lambda i: pods[i].name)
    rng.shuffle(order)
    target = inflation * capacity_milli
    total = sum(pods[i].gpu_request_milli for i in order)
    if total < target:
        if not any(p.gpu_request_milli for p in pods):
            raise ContractError("pods", "no pod asks for a GPU, so inflation never ends")
        while total < target:
            drawn = rng.randrange(len(pods))
            order.append(drawn)
            total += pods[drawn].gpu_request_milli
    else:
        while total > target:
            dropped = order.pop(rng.randrange(len(order)))
            total -= pods[dropped].gpu_request_milli
    return Arrivals(seed, tuple(nodes), tuple(order))
