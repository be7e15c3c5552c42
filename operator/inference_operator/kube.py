"""The API calls the handlers make, each returning plain dicts as the API sends them.

Children are written with server-side apply under one field manager: apply
creates what is missing and converges what drifted in the same call, and a
child's name is fixed by its parent's, so repeating an apply after a crash
can never make a second one. Whether an object is the service's to write is
decided in ownership.py, on what `read` returns. A delete carries the UID read
as a precondition, so an object replaced in between is never the one deleted;
an apply carries none (see `apply`), which leaves a window of one round trip.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from infergrid.constants import CRD_GROUP, CRD_PLURAL, CRD_VERSION

from .render import LABEL_SERVICE, LABEL_TRACK

FIELD_MANAGER = "infergrid-operator"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


class Kube:
    def __init__(self, api: client.ApiClient):
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.networking = client.NetworkingV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.resource = client.ResourceV1Api(api)

    def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One object of a child's kind, or None when there is none of that name."""
        read = self._readers()[kind]
        response = _absent_is_none(lambda: read(name, namespace, _preload_content=False))
        return None if response is None else json.loads(response.data)

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of one child, taking over fields anyone else changed. The
        caller has read the object and found it the service's own (or absent): no
        resourceVersion precondition, since the Deployment controller's status writes would
        make one fail on almost every apply."""
        patch = self._patchers()[manifest["kind"]]
        meta = manifest["metadata"]
        response = patch(
            meta["name"], meta["namespace"], manifest,
            field_manager=FIELD_MANAGER, force=True, _content_type=APPLY, _preload_content=False,
        )  # fmt: skip
        return json.loads(response.data)

    def delete(self, kind: str, namespace: str, name: str, uid: str) -> bool:
        """Deletes the object of this UID; False when it is gone or was replaced meanwhile."""
        delete = self._deleters()[kind]
        options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid))
        try:
            delete(name, namespace, body=options)
        except ApiException as err:
            if err.status in (404, 409):
                return False
            raise
        return True

    def configmaps(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The ConfigMaps labelled as the service's (ownership.py decides whose they are)."""
        return self._list(self.core.list_namespaced_config_map, namespace, _selector(name))

    def claim_templates(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The ResourceClaimTemplates labelled as the service's; none where the API server
        serves no resource.k8s.io/v1 (before Kubernetes 1.34)."""
        list_templates = self.resource.list_namespaced_resource_claim_template
        found = _absent_is_none(lambda: self._list(list_templates, namespace, _selector(name)))
        return found or []

    def replicasets(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return self._list(self.apps.list_namespaced_replica_set, namespace, _selector(name))

    def service(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The InferenceService, or None once it is gone."""
        return _absent_is_none(
            lambda: self.custom.get_namespaced_custom_object(
                CRD_GROUP, CRD_VERSION, namespace, CRD_PLURAL, name
            )
        )

    def deployments(self, namespace: str, name: str) -> dict[str, dict[str, Any]]:
        """The service's Deployments by track."""
        items = self._list(self.apps.list_namespaced_deployment, namespace, _selector(name))
        return {d["metadata"]["labels"].get(LABEL_TRACK, ""): d for d in items}

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self._list(self.core.list_namespaced_pod, namespace, selector)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """A merge patch of the status subresource: fields left out stay as they are.

        A service deleted meanwhile has no status left to write.
        """
        _absent_is_none(
            lambda: self.custom.patch_namespaced_custom_object_status(
                CRD_GROUP, CRD_VERSION, namespace, CRD_PLURAL, name, {"status": status},
                _content_type=MERGE,
            )
        )  # fmt: skip

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        """spec.replicas through the scale subresource, as `kubectl scale` writes it."""
        self.custom.patch_namespaced_custom_object_scale(
            CRD_GROUP, CRD_VERSION, namespace, CRD_PLURAL, name, {"spec": {"replicas": replicas}},
            _content_type=MERGE,
        )  # fmt: skip

    def _patchers(self) -> dict[str, Callable[..., Any]]:
        return {
            "ConfigMap": self.core.patch_namespaced_config_map,
            "Service": self.core.patch_namespaced_service,
            "Deployment": self.apps.patch_namespaced_deployment,
            "PodDisruptionBudget": self.policy.patch_namespaced_pod_disruption_budget,
            "Secret": self.core.patch_namespaced_secret,
            "NetworkPolicy": self.networking.patch_namespaced_network_policy,
            "ResourceClaimTemplate": self.resource.patch_namespaced_resource_claim_template,
        }

    def _readers(self) -> dict[str, Callable[..., Any]]:
        return {
            "ConfigMap": self.core.read_namespaced_config_map,
            "Service": self.core.read_namespaced_service,
            "Deployment": self.apps.read_namespaced_deployment,
            "PodDisruptionBudget": self.policy.read_namespaced_pod_disruption_budget,
            "Secret": self.core.read_namespaced_secret,
            "NetworkPolicy": self.networking.read_namespaced_network_policy,
            "ResourceClaimTemplate": self.resource.read_namespaced_resource_claim_template,
        }

    def _deleters(self) -> dict[str, Callable[..., Any]]:
        return {
            "ConfigMap": self.core.delete_namespaced_config_map,
            "Deployment": self.apps.delete_namespaced_deployment,
            "Pod": self.core.delete_namespaced_pod,
            "ResourceClaimTemplate": self.resource.delete_namespaced_resource_claim_template,
        }

    @staticmethod
    def _list(call: Callable[..., Any], namespace: str, selector: str) -> list[dict[str, Any]]:
        response = call(namespace, label_selector=selector, _preload_content=False)
        return json.loads(response.data)["items"]


def _selector(name: str) -> str:
    return f"{LABEL_SERVICE}={name}"


def _absent_is_none(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except ApiException as err:
        if err.status == 404:
            return None
        raise
