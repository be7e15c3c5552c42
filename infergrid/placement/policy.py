"""A placement policy, resolved once per pod and reused for every node.

Like kube-scheduler's PreScore, the name is looked up a single time: an unknown
policy fails here with a ContractError, and fit and scoring never see a name.
"""

from dataclasses import dataclass

from infergrid.errors import ContractError
from infergrid.placement.fragmentation import DEFAULT_WORKLOAD, Workload
from infergrid.placement.gpu_choice import GPU_CHOICES, SIMULATION_GPU_CHOICES, GpuChoice
from infergrid.placement.scoring import RawScorer, policy_names, raw_scorer


@dataclass(frozen=True, slots=True)
class Policy:
    """How to choose GPUs within a node and how to rate the node afterwards.

    ``salt`` is a random number the caller draws per pod for choices made at random
    (random-fit, a simulation-only policy); every other policy ignores it.
    """

    name: str
    choice: GpuChoice
    raw_score: RawScorer
    workload: Workload = DEFAULT_WORKLOAD
    salt: int = 0


def resolve_policy(name: str, workload: Workload = DEFAULT_WORKLOAD) -> Policy:
    """The policy called ``name`` (one of ``PLACEMENT_POLICIES``, or a simulation-only one);
    ``workload`` matters to fgd only."""
    score = raw_scorer(name)
    choice = GPU_CHOICES.get(name) or SIMULATION_GPU_CHOICES.get(name)
    if choice is None:
        raise ContractError("policy", f"{name!r} is not one of {', '.join(policy_names())}")
    return Policy(name=name, choice=choice, raw_score=score, workload=workload)
