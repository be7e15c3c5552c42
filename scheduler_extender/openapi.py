"""The extender's OpenAPI document: kube-scheduler's extender v1 verbs, the probes, /metrics.

The envelope schemas are built from `protocol`'s own key constants, so a renamed key changes
the document with the reader, and tests/scheduler_extender/test_openapi.py checks both ways
(a body the schema allows is read; a body with one property of the wrong type is refused
naming it). Go's extender v1 structs carry no JSON tags, hence the PascalCase envelope; the
Pod inside is ordinary Kubernetes JSON, of which only the fields the extender reads are
described. Two listeners serve these paths: the verbs, the probes and this document on the
verbs listener (loopback only), and /metrics (with its own /healthz) on the metrics listener.
"""

from __future__ import annotations

from typing import Final

from infergrid.constants import (
    ANNOTATION_PLACEMENT_POLICY,
    ANNOTATION_TOPOLOGY,
    RESOURCE_GPU,
    RESOURCE_GPU_CORES,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
)
from infergrid.openapi import OPENAPI_PATH, Operation, Response, Schema, document
from scheduler_extender import protocol as p

VERBS_LISTENER: Final = "verbs listener"
METRICS_LISTENER: Final = "metrics listener"

_TEXT: Schema = {"type": "string"}
_NAME: Schema = {"type": "string", "minLength": 1}
_QUANTITY: Schema = {"type": "string", "description": "a Kubernetes quantity, a whole number"}
_STRING_MAP: Schema = {"type": "object", "additionalProperties": _TEXT}


def _named(key: str) -> Schema:
    """An object that must carry a `metadata` with a non-empty `key` (name, uid)."""
    metadata = {"type": "object", "required": [key], "properties": {key: _NAME}}
    return {"type": "object", "required": ["metadata"], "properties": {"metadata": metadata}}


_RESOURCES: Schema = {
    "type": "object",
    "additionalProperties": _TEXT,
    "properties": {
        name: _QUANTITY
        for name in (RESOURCE_GPU, RESOURCE_VGPU, RESOURCE_GPU_MEMORY, RESOURCE_GPU_CORES)
    },
}
POD: Schema = {
    "type": "object",
    "description": "a core/v1 Pod; the fields the extender reads",
    "required": ["metadata"],
    "properties": {
        "metadata": {
            "type": "object",
            "properties": {
                "name": _TEXT,
                "namespace": _TEXT,
                "uid": _TEXT,
                "annotations": {
                    "type": "object",
                    "additionalProperties": _TEXT,
                    "properties": {ANNOTATION_PLACEMENT_POLICY: _TEXT, ANNOTATION_TOPOLOGY: _TEXT},
                },
            },
        },
        "spec": {
            "type": "object",
            "properties": {
                "priority": {"type": "integer"},
                "preemptionPolicy": {"enum": ["PreemptLowerPriority", "Never"]},
                "containers": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": _TEXT,
                            "resources": {
                                "type": "object",
                                "properties": {"limits": _RESOURCES, "requests": _RESOURCES},
                            },
                        },
                    },
                },
            },
        },
    },
}
NODE_LIST: Schema = {
    "type": "object",
    "description": "a core/v1 NodeList, read only for its names when NodeNames is absent",
    "properties": {
        "items": {
            "type": "array",
            "items": _named("name"),
        }
    },
}
EXTENDER_ARGS: Schema = {
    "type": "object",
    "description": "ExtenderArgs; with nodeCacheCapable the scheduler sends NodeNames",
    "required": [p.POD, p.NODE_NAMES],
    "properties": {
        p.POD: POD,
        p.NODE_NAMES: {"type": "array", "items": _NAME},
        p.NODES: NODE_LIST,
    },
}
FILTER_RESULT: Schema = {
    "type": "object",
    "description": "ExtenderFilterResult",
    "required": [p.NODE_NAMES, p.FAILED_NODES, p.FAILED_AND_UNRESOLVABLE, p.ERROR],
    "properties": {
        p.NODE_NAMES: {"type": "array", "items": _NAME},
        p.FAILED_NODES: _STRING_MAP,
        p.FAILED_AND_UNRESOLVABLE: _STRING_MAP,
        p.ERROR: _TEXT,
    },
}
HOST_PRIORITY_LIST: Schema = {
    "type": "array",
    "description": "HostPriorityList: a score from 0 to 10 per node",
    "items": {
        "type": "object",
        "required": [p.HOST, p.SCORE],
        "properties": {p.HOST: _NAME, p.SCORE: {"type": "integer", "minimum": 0, "maximum": 10}},
    },
}
BINDING_ARGS: Schema = {
    "type": "object",
    "description": "ExtenderBindingArgs",
    "required": [p.POD_NAME, p.POD_NAMESPACE, p.POD_UID, p.NODE],
    "properties": {key: _NAME for key in (p.POD_NAME, p.POD_NAMESPACE, p.POD_UID, p.NODE)},
}
ERROR_RESULT: Schema = {
    "type": "object",
    "description": "ExtenderBindingResult, and every refusal: `Error` is 'field: reason'",
    "required": [p.ERROR],
    "properties": {p.ERROR: _TEXT},
}
_META_VICTIMS: Schema = {
    "type": "object",
    "description": "MetaVictims: the victims' uids",
    "properties": {
        p.VICTIM_PODS: {
            "type": "array",
            "items": {"type": "object", "required": [p.UID], "properties": {p.UID: _NAME}},
        },
        p.PDB_VIOLATIONS: {"type": "integer"},
    },
}
_VICTIMS: Schema = {
    "type": "object",
    "description": "Victims: whole pods",
    "properties": {
        p.VICTIM_PODS: {
            "type": "array",
            "items": _named("uid"),
        },
        p.PDB_VIOLATIONS: {"type": "integer"},
    },
}
PREEMPTION_ARGS: Schema = {
    "type": "object",
    "description": "ExtenderPreemptionArgs: victims by node, as uids or as whole pods",
    "required": [p.POD],
    "properties": {
        p.POD: POD,
        p.NODE_TO_VICTIMS: {"type": "object", "additionalProperties": _VICTIMS},
        p.NODE_TO_META_VICTIMS: {"type": "object", "additionalProperties": _META_VICTIMS},
    },
}
PREEMPTION_RESULT: Schema = {
    "type": "object",
    "description": "ExtenderPreemptionResult: the nodes that remain candidates",
    "required": [p.NODE_TO_META_VICTIMS],
    "properties": {
        p.NODE_TO_META_VICTIMS: {"type": "object", "additionalProperties": _META_VICTIMS}
    },
}

_REFUSED = Response("a field is missing or of the wrong kind; Error names it", ERROR_RESULT)
_TOO_LARGE = Response("the body is larger than the extender reads")
_TEXT_OK = Response("ok", {"type": "string"}, "text/plain")


def _verb(path: str, summary: str, body: Schema, answer: Response) -> Operation:
    return Operation(
        "post", path, summary, {200: answer, 400: _REFUSED, 413: _TOO_LARGE}, body,
        (VERBS_LISTENER,),
    )  # fmt: skip


OPERATIONS: Final = [
    _verb("/filter", "the nodes where the pod fits, and a reason for every other node",
          EXTENDER_ARGS, Response("ExtenderFilterResult", FILTER_RESULT)),
    _verb("/prioritize", "a score per node from the pod's placement policy",
          EXTENDER_ARGS, Response("HostPriorityList", HOST_PRIORITY_LIST)),
    _verb("/bind", "re-checks the placement, writes the assignment, binds the pod",
          BINDING_ARGS, Response("ExtenderBindingResult; Error says why a bind was refused",
                                 ERROR_RESULT)),
    _verb("/preempt", "keeps the nodes where evicting the victims frees the GPU the pod needs",
          PREEMPTION_ARGS, Response("ExtenderPreemptionResult", PREEMPTION_RESULT)),
    Operation("get", "/healthz", "the process serves", {200: _TEXT_OK},
              tags=(VERBS_LISTENER, METRICS_LISTENER)),
    Operation("get", "/readyz", "ready once the cache is synced and this replica leads",
              {200: _TEXT_OK, 503: Response("not ready", {"type": "string"}, "text/plain")},
              tags=(VERBS_LISTENER,)),
    Operation("get", OPENAPI_PATH, "this document", {200: Response("the OpenAPI document")},
              tags=(VERBS_LISTENER,)),
    Operation("get", "/metrics", "Prometheus metrics, on the metrics listener only",
              {200: Response("Prometheus text format", None, "text/plain")},
              tags=(METRICS_LISTENER,)),
]  # fmt: skip

DOCUMENT: Final = document(
    "InferGrid scheduler extender",
    "v1",
    "kube-scheduler's extender v1 verbs (PascalCase envelope, as Go marshals its untagged "
    "structs), served on the verbs listener (loopback only) with the probes and this document; "
    "/metrics is served on the metrics listener, which serves none of the verbs.",
    OPERATIONS,
)
