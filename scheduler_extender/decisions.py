"""Filter and prioritize, decided over a PlacementView: no HTTP, no API server.

Every rejected node gets its reason, so the pod's FailedScheduling event
tells people what to change. A node that can never take the pod (unknown, no
inventory, invalid request) goes to FailedAndUnresolvableNodes, so preemption
does not evict pods for nothing, and so does a pod asking for a policy that does
not exist: its reason names the annotation. So does a node that serves GPUs the other way
than the pod asks for them: a pod asking ``infergrid.io/gpu-claim`` goes to DRA nodes only,
a device-plugin pod never there (a claim pod's request is read from its claims in the cache,
so the same core and policy decide both). The view brings the nodes up to date;
the placement core's ``NodeSet``, the entry point the simulator replays through
too, answers for all of them at once. This module only resolves the pod's request
and policy once and normalises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from infergrid.dra_ledger import ClaimMissing
from infergrid.errors import ContractError
from infergrid.placement import (
    LEARNING,
    HostRequest,
    Policy,
    choose_victims,
    fit,
    normalize_scores,
    resolve_policy,
)
from infergrid.placement.preemption import without
from infergrid.pod_host import parse_host_request
from infergrid.pod_request import PodGpuRequest
from infergrid.records import pod_priority
from scheduler_extender.preemptor import split_holders
from scheduler_extender.protocol import Victims
from scheduler_extender.view import PlacementView

CLAIM_PENDING: Final = "claim-pending"
"""The rejection category of every node while a claim the pod names is not there yet."""
GPU_MODE: Final = "gpu-mode"
"""The rejection category of a node that serves GPUs the other way than the pod asks."""


@dataclass
class FilterOutcome:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    categories: list[str] = field(default_factory=list)


def _policy(request: PodGpuRequest, view: PlacementView) -> Policy:
    return resolve_policy(request.policy, view.workload())


def _host(pod: dict[str, Any]) -> HostRequest | None:
    """The pod's CPU and GPU models, for the learned workload only; None where an amount
    does not read (kube-scheduler, not the extender, refuses such a pod)."""
    try:
        return parse_host_request(pod)
    except ContractError:
        return None


def filter_nodes(
    pod: dict[str, Any], names: list[str], view: PlacementView, default_policy: str, now: datetime
) -> FilterOutcome:
    try:
        request = view.request_of(pod, default_policy)
    except ClaimMissing as err:
        return FilterOutcome(failed=dict.fromkeys(names, str(err)),
                             categories=[CLAIM_PENDING] * len(names))  # fmt: skip
    except ContractError as err:
        return FilterOutcome(
            unresolvable={n: f"invalid GPU request: {err}" for n in names},
            categories=["invalid-request"] * len(names),
        )
    uid = str((pod.get("metadata") or {}).get("uid", ""))
    view.observe(uid, request, _host(pod))
    policy = _policy(request, view)
    rows, missing = view.current(names, now)
    found = view.nodes.filter(names, request, policy, rows, missing)
    view.remember(found, len(names))
    out = FilterOutcome(found.passed, found.failed, found.unresolvable, found.categories)
    _keep_mode(out, request, view)
    own = _recorded_on(uid, view)
    if own in out.failed and _fits_beside_others(request, uid, own, view, policy, now):
        del out.failed[own]
        out.passed = [n for n in names if n in out.passed or n == own]
        for category in _shortfalls(request, view, own, policy, now):  # not a rejection now
            if category in out.categories:
                out.categories.remove(category)
    return out


def _keep_mode(out: FilterOutcome, request: PodGpuRequest, view: PlacementView) -> None:
    """Makes every node that serves GPUs the other way (device plugin or DRA) than the pod
    asks unresolvable: no preemption there gives it room. Nothing to do for a device-plugin
    pod in a cluster without DRA nodes, the common case."""
    dra = view.cache.dra_nodes()
    if not request.by_claim and not (request.gpu_containers and dra):
        return
    for name in [n for n in (*out.passed, *out.failed) if (n in dra) != request.by_claim]:
        why = view.wrong_mode(request, name)
        if why is not None:
            out.failed.pop(name, None)
            out.unresolvable[name] = why
            out.categories.append(GPU_MODE)
    out.passed = [n for n in out.passed if n not in out.unresolvable]


def _recorded_on(uid: str, view: PlacementView) -> str | None:
    """The node an unbound pod's own assignment names: a bind wrote it and never created the
    Binding (its extender was killed between the two, or the API server failed both the
    Binding and the undo). The cache counts those GPUs as the pod's, so the pod must be
    judged there without them, or it waits forever for room it holds itself."""
    record = view.cache.pod(uid)
    if record is None or record.node_name or record.assignment is None:
        return None
    return record.assignment.node


def _fits_beside_others(
    request: PodGpuRequest, uid: str, node: str, view: PlacementView, policy: Policy, now: datetime
) -> bool:
    """Whether the pod fits `node` once what it holds there itself is set aside; bind then
    honours its recorded assignment as a retried bind does."""
    state = view.node_state(node, now)
    if isinstance(state, str):
        return False
    itself, _ = split_holders(view.cache, node, {uid})
    return fit(request, without(state, itself), policy).fits


def _shortfalls(
    request: PodGpuRequest, view: PlacementView, node: str, policy: Policy, now: datetime
) -> list[str]:
    """The rejection categories filter counted for `node`: the resources it fell short of."""
    state = view.node_state(node, now)
    if isinstance(state, str):
        return []
    return [s.resource for s in fit(request, state, policy).shortfalls]


def prioritize_nodes(
    pod: dict[str, Any], names: list[str], view: PlacementView, default_policy: str, now: datetime
) -> dict[str, int]:
    """0–10 per node, normalised over the nodes that fit; the others get 0."""
    try:
        request = view.request_of(pod, default_policy)
    except ContractError:
        return dict.fromkeys(names, 0)
    rows, _ = view.current(names, now)
    # The policies that learn read CPU too: the pod's, as the simulator passes it.
    learns = request.policy in LEARNING
    host = _host(pod) if learns else None
    raw = view.nodes.scores(names, request, _policy(request, view), host, rows)
    if learns:
        view.scored(request, host)
    return dict(zip(names, _normalized(raw), strict=True))


def preempt_nodes(
    pod: dict[str, Any],
    proposed: dict[str, Victims],
    view: PlacementView,
    default_policy: str,
    now: datetime,
    preemptible: frozenset[str],
) -> dict[str, Victims]:
    """The preempt verb: per node kube-scheduler proposes, its victims plus the fewest
    lower-priority GPU holders of a `preemptible` class whose eviction lets the pod's GPUs
    fit (`choose_victims`); a node where no eviction makes room is left out, so no pod is
    evicted there for nothing.

    kube-scheduler's own victims stay (they free what it counts: CPU, memory, ports), and
    their GPUs count as freed; but a node where it proposes a GPU holder of a class outside
    `preemptible` is left out too, so no GPU holder that did not agree to it is evicted. Its
    PodDisruptionBudget count is passed on as it is: the extender does not read budgets. A
    pod without GPU containers is not the extender's to judge, and an unreadable request
    fits nowhere, so every node is dropped.
    """
    try:
        request = view.request_of(pod, default_policy)
    except ContractError:
        return {}
    if not request.gpu_containers:
        return {n: v for n, v in proposed.items() if view.wrong_mode(request, n) is None}
    policy, priority = _policy(request, view), pod_priority(pod)
    kept: dict[str, Victims] = {}
    for name, victims in proposed.items():
        if view.wrong_mode(request, name) is not None:
            continue
        node = view.node_state(name, now)
        if isinstance(node, str):
            continue
        gone, others = split_holders(view.cache, name, set(victims.uids))
        if any(h.priority_class not in preemptible for h in gone):
            continue
        after = without(node, gone)
        chosen = choose_victims(request, after, others, priority, policy, preemptible)
        if chosen is not None:
            kept[name] = Victims(victims.uids + chosen, victims.pdb_violations)
    return kept


def _normalized(raw: npt.NDArray[np.float64]) -> list[int]:
    """``normalize_scores`` of each raw score, NaN (does not fit) giving 0 as any
    non-finite score does there.

    It is worked out once per distinct score: nodes in the same state score the same,
    and at thousands of nodes most share their score with others. Each node's result
    depends only on its score and the lowest and highest finite one, which the distinct
    scores keep, so the answer is the same as over every node.
    """
    distinct, at = np.unique(raw, return_inverse=True)
    return np.asarray(normalize_scores(distinct.tolist()), dtype=np.int64)[at].tolist()
