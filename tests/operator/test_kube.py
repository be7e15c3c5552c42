"""The thin API edge: writes carry what was read as a precondition, so an object replaced
between the read and the write is never the one written."""

from __future__ import annotations

from unittest.mock import MagicMock

from kubernetes.client.rest import ApiException

from inference_operator.kube import Kube


def kube() -> Kube:
    k = Kube.__new__(Kube)
    k.apps, k.core, k.policy, k.custom = MagicMock(), MagicMock(), MagicMock(), MagicMock()
    return k


def test_a_delete_names_the_uid_read_and_a_replaced_object_is_not_deleted():
    k = kube()
    assert k.delete("ConfigMap", "ns", "chat-stable-0123456789", "cm-1")
    options = k.core.delete_namespaced_config_map.call_args.kwargs["body"]
    assert options.preconditions.uid == "cm-1"
    k.apps.delete_namespaced_deployment.side_effect = ApiException(status=409)
    assert not k.delete("Deployment", "ns", "chat-canary", "d-1")


def test_reading_an_absent_object_is_none():
    k = kube()
    k.policy.read_namespaced_pod_disruption_budget.side_effect = ApiException(status=404)
    assert k.read("PodDisruptionBudget", "ns", "chat") is None
