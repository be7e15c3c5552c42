"""The kube-scheduler extender v1 JSON, read and written.

kube-scheduler marshals its Go structs without JSON tags, so the envelope keys
are PascalCase (`Pod`, `NodeNames`, `FailedNodes`, `Host`, `Score`) while the
Pod inside is ordinary camelCase Kubernetes JSON. With `nodeCacheCapable: true`
the scheduler sends node names only; the extender's cache holds the nodes.
Bodies are read and written with orjson: at 5,000 nodes the standard library's
encoder alone took a millisecond or two of a call that must stay under ten.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from infergrid.errors import ContractError


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    pod: dict[str, Any]
    node_names: list[str]


@dataclass(frozen=True, slots=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


@dataclass(frozen=True, slots=True)
class Victims:
    """What kube-scheduler's own preemption would evict on one node: pod uids, and how many
    PodDisruptionBudgets that would violate."""

    uids: tuple[str, ...]
    pdb_violations: int


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    pod: dict[str, Any]
    nodes: dict[str, Victims]


def _object(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise ContractError("body", f"not valid JSON: {err}") from None
    if not isinstance(doc, dict):
        raise ContractError("body", f"expected a JSON object, got {type(doc).__name__}")
    return doc


def _string(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value:
        raise ContractError(key, "is required and must be a non-empty string")
    return value


def _node_names(doc: dict[str, Any]) -> list[str]:
    """NodeNames, or the names in a full NodeList when the scheduler sent one."""
    names = doc.get("NodeNames")
    if names is None and isinstance(doc.get("Nodes"), dict):
        items = doc["Nodes"].get("items") or []
        names = [((n or {}).get("metadata") or {}).get("name") for n in items]
    # Whole-list checks in C: thousands of names arrive per call.
    if not isinstance(names, list) or not {str}.issuperset(map(type, names)) or "" in names:
        raise ContractError("NodeNames", "must be a list of node names")
    return names


def decode_extender_args(body: bytes) -> ExtenderArgs:
    doc = _object(body)
    pod = doc.get("Pod")
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise ContractError("Pod", "is required and must be a Pod object")
    return ExtenderArgs(pod=pod, node_names=_node_names(doc))


def decode_preemption_args(body: bytes) -> PreemptionArgs:
    """ExtenderPreemptionArgs: NodeNameToMetaVictims (uids only, with nodeCacheCapable) or
    NodeNameToVictims (whole pods)."""
    doc = _object(body)
    pod = doc.get("Pod")
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise ContractError("Pod", "is required and must be a Pod object")
    key = "NodeNameToMetaVictims" if doc.get("NodeNameToMetaVictims") else "NodeNameToVictims"
    table = doc.get(key) or {}
    if not isinstance(table, dict):
        raise ContractError(key, "must map node names to victims")
    return PreemptionArgs(pod, {node: _victims(key, node, v) for node, v in table.items()})


def _victims(key: str, node: str, victims: Any) -> Victims:
    field = f"{key}[{node!r}]"
    if not node or not isinstance(victims, dict):
        raise ContractError(field, "must be a victims object under a node name")
    pods, violations = victims.get("Pods") or [], victims.get("NumPDBViolations") or 0
    if not isinstance(pods, list) or not isinstance(violations, int):
        raise ContractError(field, "Pods must be a list and NumPDBViolations an integer")
    uids = []
    for pod in pods:
        uid = (
            (pod.get("UID") or (pod.get("metadata") or {}).get("uid"))
            if isinstance(pod, dict)
            else None
        )
        if not isinstance(uid, str) or not uid:
            raise ContractError(f"{field}.Pods", "every victim needs a UID")
        uids.append(uid)
    return Victims(tuple(uids), violations)


def preemption_result(nodes: dict[str, Victims]) -> dict[str, Any]:
    """ExtenderPreemptionResult: the nodes that remain candidates, each with its victims."""
    return {
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in v.uids], "NumPDBViolations": v.pdb_violations}
            for node, v in nodes.items()
        }
    }


def decode_binding_args(body: bytes) -> BindingArgs:
    doc = _object(body)
    return BindingArgs(
        pod_name=_string(doc, "PodName"),
        pod_namespace=_string(doc, "PodNamespace"),
        pod_uid=_string(doc, "PodUID"),
        node=_string(doc, "Node"),
    )


def filter_result(
    passed: list[str], failed: dict[str, str], unresolvable: dict[str, str], error: str = ""
) -> dict[str, Any]:
    """FailedAndUnresolvableNodes tells preemption that evicting pods would not help."""
    return {
        "NodeNames": passed,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": error,
    }


def priority_list(scores: dict[str, int]) -> list[dict[str, Any]]:
    """A bare array, as kube-scheduler expects from prioritize."""
    return [{"Host": host, "Score": score} for host, score in scores.items()]


def binding_result(error: str = "") -> dict[str, str]:
    return {"Error": error}


def encode(doc: dict[str, Any] | list[dict[str, Any]]) -> bytes:
    """A response body: compact UTF-8 JSON."""
    return orjson.dumps(doc)
