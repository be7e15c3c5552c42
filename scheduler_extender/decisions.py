"""Filter and prioritize, decided over a PlacementView: no HTTP, no API server.

Every rejected node gets its reason, and every shortfall of it, so the
pod's FailedScheduling event tells people what to change. A node that can
never take the pod (unknown, no inventory, invalid request) goes to
FailedAndUnresolvableNodes, so preemption does not evict pods for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from infergrid.errors import ContractError
from infergrid.placement import Policy, normalize_scores, resolve_policy
from infergrid.pod_request import PodGpuRequest, parse_pod_request
from scheduler_extender.view import PlacementView


@dataclass
class FilterOutcome:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    categories: list[str] = field(default_factory=list)


def _policy(request: PodGpuRequest, view: PlacementView) -> Policy:
    return resolve_policy(request.policy, view.workload())


def filter_nodes(
    pod: dict[str, Any], names: list[str], view: PlacementView, default_policy: str, now: datetime
) -> FilterOutcome:
    out = FilterOutcome()
    try:
        request = parse_pod_request(pod, default_policy)
    except ContractError as err:
        out.unresolvable = {n: f"invalid GPU request: {err}" for n in names}
        out.categories = ["invalid-request"] * len(names)
        return out
    view.observe(str((pod.get("metadata") or {}).get("uid", "")), request)
    policy = _policy(request, view)
    for name, decision in zip(names, view.decide(names, request, policy, now, False), strict=True):
        if isinstance(decision, str):
            out.unresolvable[name] = decision
            out.categories.append("no-inventory")
        elif decision[0].fits:
            out.passed.append(name)
        else:
            out.failed[name] = "; ".join(decision[0].reasons)
            out.categories.extend(s.resource for s in decision[0].shortfalls)
    return out


def prioritize_nodes(
    pod: dict[str, Any], names: list[str], view: PlacementView, default_policy: str, now: datetime
) -> dict[str, int]:
    """0–10 per node, normalised over the nodes that fit; the others get 0."""
    try:
        request = parse_pod_request(pod, default_policy)
    except ContractError:
        return dict.fromkeys(names, 0)
    policy = _policy(request, view)
    raw: dict[str, float] = {}
    for name, decision in zip(names, view.decide(names, request, policy, now, True), strict=True):
        if not isinstance(decision, str) and decision[1] is not None:
            raw[name] = decision[1]
    scores = dict.fromkeys(names, 0)
    scores.update(zip(raw, normalize_scores(list(raw.values())), strict=True))
    return scores
