"""Which of an InferenceService's engine ConfigMaps may go.

Each engine config is its own immutable ConfigMap, named by the config's hash, so a pod
always reads the config its ReplicaSet was made with: a pod of the old ReplicaSet that
restarts mid-rollout loads the old config, not the new one early. An old ConfigMap is
collected once nothing can start a pod from it any more: no current Deployment names it,
no ReplicaSet that has or wants pods names it (a rollout under way, or rolled back,
scales those up again), and no pod that still exists (terminating included) mounts it.
The config the current spec renders is always kept, so a collection racing a reconcile
never takes the ConfigMap it is about to point a Deployment at. A service's
ResourceClaimTemplates are named by hash the same way (claims.py), and go by the same rule.
Pure: the handlers list the objects and pass them in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .claims import templates_named
from .ownership import controlled_by

PodSpecNames = Callable[[Mapping[str, Any]], set[str]]


def mounted_configmaps(pod_spec: Mapping[str, Any]) -> set[str]:
    """The ConfigMaps a pod spec's volumes name."""
    volumes = pod_spec.get("volumes") or []
    return {v["configMap"]["name"] for v in volumes if v.get("configMap")}


def configmaps_in_use(
    deployments: Iterable[Mapping[str, Any]],
    replicasets: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
) -> set[str]:
    """Every ConfigMap a pod of the service runs with, or may yet be started with."""
    return _in_use(deployments, replicasets, pods, mounted_configmaps)


def claim_templates_in_use(
    deployments: Iterable[Mapping[str, Any]],
    replicasets: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
) -> set[str]:
    """Every ResourceClaimTemplate a pod of the service was or may yet be started with."""
    return _in_use(deployments, replicasets, pods, templates_named)


def _in_use(
    deployments: Iterable[Mapping[str, Any]],
    replicasets: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    names: PodSpecNames,
) -> set[str]:
    used: set[str] = set()
    for workload in deployments:
        used |= names(workload["spec"]["template"]["spec"])
    for rs in replicasets:
        if rs["spec"].get("replicas") or (rs.get("status") or {}).get("replicas"):
            used |= names(rs["spec"]["template"]["spec"])
    for pod in pods:
        used |= names(pod["spec"])
    return used


def collectable(
    configmaps: Iterable[Mapping[str, Any]], uid: str, keep: set[str]
) -> list[tuple[str, str]]:
    """(name, uid) of each object (ConfigMap or claim template) this service controls and
    nothing needs any more.

    One it does not control is never collected, whatever its labels say.
    """
    return [
        (cm["metadata"]["name"], cm["metadata"]["uid"])
        for cm in configmaps
        if controlled_by(cm, uid) and cm["metadata"]["name"] not in keep
    ]


def rollout_settled(deployment: Mapping[str, Any]) -> bool:
    """The Deployment's controller has seen its current spec and every pod it counts runs
    that template: from here on, old ReplicaSets only shrink."""
    meta, status = deployment["metadata"], deployment.get("status") or {}
    seen = status.get("observedGeneration", 0) >= meta.get("generation", 0)
    return seen and status.get("updatedReplicas", 0) == status.get("replicas", 0)
