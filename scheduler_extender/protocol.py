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

# The envelope's keys, as kube-scheduler's Go field names spell them (extender/v1 types.go);
# the readers below and the OpenAPI document (scheduler_extender/openapi.py) both use these.
POD = "Pod"
NODES = "Nodes"
NODE_NAMES = "NodeNames"
FAILED_NODES = "FailedNodes"
FAILED_AND_UNRESOLVABLE = "FailedAndUnresolvableNodes"
ERROR = "Error"
HOST = "Host"
SCORE = "Score"
POD_NAME = "PodName"
POD_NAMESPACE = "PodNamespace"
POD_UID = "PodUID"
NODE = "Node"
NODE_TO_VICTIMS = "NodeNameToVictims"
NODE_TO_META_VICTIMS = "NodeNameToMetaVictims"
VICTIM_PODS = "Pods"
PDB_VIOLATIONS = "NumPDBViolations"
UID = "UID"
POD_IDENTITY = ("name", "namespace", "uid")  # the Pod's metadata fields every verb reads


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
    names, nodes = doc.get(NODE_NAMES), doc.get(NODES)
    if nodes is not None and not isinstance(nodes, dict):
        raise ContractError(NODES, "must be a NodeList object")
    if names is None and nodes is not None:
        names = _names_in(nodes)
    # Whole-list checks in C: thousands of names arrive per call.
    if not isinstance(names, list) or not {str}.issuperset(map(type, names)) or "" in names:
        raise ContractError(NODE_NAMES, "must be a list of node names")
    return names


def _names_in(nodes: dict[str, Any]) -> list[str]:
    """The node names of a NodeList, each one required."""
    items = nodes.get("items") or []
    if not isinstance(items, list):
        raise ContractError(f"{NODES}.items", "must be a list of nodes")
    names = []
    for i, node in enumerate(items):
        meta = node.get("metadata") if isinstance(node, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            raise ContractError(f"{NODES}.items[{i}].metadata.name", "is required")
        names.append(name)
    return names


def _pod(doc: dict[str, Any]) -> dict[str, Any]:
    """The Pod, with the parts every verb reads checked: its name, namespace and uid are
    strings (a uid nested a thousand deep made `str()` of it raise), its spec an object."""
    pod = doc.get(POD)
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise ContractError(POD, "is required and must be a Pod object")
    for key in POD_IDENTITY:
        if not isinstance(pod["metadata"].get(key) or "", str):
            raise ContractError(f"{POD}.metadata.{key}", "must be a string")
    if not isinstance(pod.get("spec") or {}, dict):
        raise ContractError(f"{POD}.spec", "must be a PodSpec object")
    return pod


def decode_extender_args(body: bytes) -> ExtenderArgs:
    doc = _object(body)
    return ExtenderArgs(pod=_pod(doc), node_names=_node_names(doc))


def decode_preemption_args(body: bytes) -> PreemptionArgs:
    """ExtenderPreemptionArgs: NodeNameToMetaVictims (uids only, with nodeCacheCapable) or
    NodeNameToVictims (whole pods)."""
    doc = _object(body)
    pod = _pod(doc)
    key = NODE_TO_META_VICTIMS if doc.get(NODE_TO_META_VICTIMS) else NODE_TO_VICTIMS
    table = doc.get(key) or {}
    if not isinstance(table, dict):
        raise ContractError(key, "must map node names to victims")
    return PreemptionArgs(pod, {node: _victims(key, node, v) for node, v in table.items()})


def _victims(key: str, node: str, victims: Any) -> Victims:
    field = f"{key}[{node!r}]"
    if not node or not isinstance(victims, dict):
        raise ContractError(field, "must be a victims object under a node name")
    pods, violations = victims.get(VICTIM_PODS) or [], victims.get(PDB_VIOLATIONS) or 0
    if not isinstance(pods, list) or not isinstance(violations, int):
        raise ContractError(field, "Pods must be a list and NumPDBViolations an integer")
    uids = [_victim_uid(pod) for pod in pods]
    if not all(isinstance(uid, str) and uid for uid in uids):
        raise ContractError(f"{field}.Pods", "every victim needs a UID")
    return Victims(tuple(uids), violations)


def _victim_uid(pod: Any) -> Any:
    """A MetaPod's `UID`, or a whole pod's `metadata.uid`; None where neither is there."""
    if not isinstance(pod, dict):
        return None
    meta = pod.get("metadata")
    return pod.get(UID) or (meta.get("uid") if isinstance(meta, dict) else None)


def preemption_result(nodes: dict[str, Victims]) -> dict[str, Any]:
    """ExtenderPreemptionResult: the nodes that remain candidates, each with its victims."""
    return {
        NODE_TO_META_VICTIMS: {
            node: {VICTIM_PODS: [{UID: uid} for uid in v.uids], PDB_VIOLATIONS: v.pdb_violations}
            for node, v in nodes.items()
        }
    }


def decode_binding_args(body: bytes) -> BindingArgs:
    doc = _object(body)
    return BindingArgs(
        pod_name=_string(doc, POD_NAME),
        pod_namespace=_string(doc, POD_NAMESPACE),
        pod_uid=_string(doc, POD_UID),
        node=_string(doc, NODE),
    )


def filter_result(
    passed: list[str], failed: dict[str, str], unresolvable: dict[str, str], error: str = ""
) -> dict[str, Any]:
    """FailedAndUnresolvableNodes tells preemption that evicting pods would not help."""
    return {
        NODE_NAMES: passed,
        FAILED_NODES: failed,
        FAILED_AND_UNRESOLVABLE: unresolvable,
        ERROR: error,
    }


def priority_list(scores: dict[str, int]) -> list[dict[str, Any]]:
    """A bare array, as kube-scheduler expects from prioritize."""
    return [{HOST: host, SCORE: score} for host, score in scores.items()]


def binding_result(error: str = "") -> dict[str, str]:
    return {ERROR: error}


def encode(doc: dict[str, Any] | list[dict[str, Any]]) -> bytes:
    """A response body: compact UTF-8 JSON."""
    return orjson.dumps(doc)
