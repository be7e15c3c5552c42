"""Which of an InferenceService's engine ConfigMaps may go.

Each engine config is its own immutable ConfigMap, named by the config's hash, so a pod
always reads the config its ReplicaSet was made with: a pod of the old ReplicaSet that
restarts mid-rollout loads the old config, not the new one early. An old ConfigMap is
collected once nothing can start a pod from it any more: no current Deployment names it,
no ReplicaSet that has or wants pods names it (a rollout under way, or rolled back,
scales those up again), and no pod that still exists (terminating included) mounts it.
The config the current spec renders is always kept, so a collection racing a reconcile
never takes the ConfigMap it is about to point a Deployment at. Pure: the handlers list
the objects and pass them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .ownership import controlled_by


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
    used: set[str] = set()
    for workload in deployments:
        used |= mounted_configmaps(workload["spec"]["template"]["spec"])
    for rs in replicasets:
        if rs["spec"].get("replicas") or (rs.get("status") or {}).get("replicas"):
            used |= mounted_configmaps(rs["spec"]["template"]["spec"])
    for pod in pods:
        used |= mounted_configmaps(pod["spec"])
    return used


def collectable(
    configmaps: Iterable[Mapping[str, Any]], uid: str, keep: set[str]
) -> list[tuple[str, str]]:
    """(name, uid) of each ConfigMap this service controls and nothing needs any more.

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
