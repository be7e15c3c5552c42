"""The thin API edge: writes carry what was read as a precondition, so an object replaced
between the read and the write is never the one written."""

from __future__ import annotations

from types import SimpleNamespace
from unittest.mock import MagicMock

from kubernetes.client.rest import ApiException

from inference_operator.engine_access import EngineAccess
from inference_operator.kube import Kube
from inference_operator.render import render_children
from inference_operator.spec import parse_spec


def kube() -> Kube:
    k = Kube.__new__(Kube)
    k.apps, k.core, k.policy, k.custom = MagicMock(), MagicMock(), MagicMock(), MagicMock()
    k.networking, k.resource = MagicMock(), MagicMock()
    return k


def test_every_kind_of_child_rendered_can_be_read_and_applied():
    """The ownership check reads each child before the apply writes it."""
    access = EngineAccess(network_policy=True, token_key=b"k" * 32)
    claims = [{"name": "gpu", "kind": "share", "memory": "4Gi"}]
    service = parse_spec({"model": {"name": "m", "storageUri": "pkg://m"},
                          "resources": {"claims": claims}}, "engine", "scheduler")  # fmt: skip
    k, called = Kube.__new__(Kube), []
    k.apps = k.core = k.policy = k.networking = k.resource = Answering(called)
    for child in render_children(service, "chat", "ns", access=access):
        k.read(child["kind"], "ns", child["metadata"]["name"])
        k.apply(child)
    assert {"read_namespaced_secret", "patch_namespaced_secret", "read_namespaced_network_policy",
            "patch_namespaced_network_policy", "read_namespaced_resource_claim_template",
            "patch_namespaced_resource_claim_template"} <= set(called)  # fmt: skip


def test_claim_templates_are_none_where_the_api_serves_no_dra():
    k = kube()
    k.resource.list_namespaced_resource_claim_template.side_effect = ApiException(status=404)
    assert k.claim_templates("ns", "chat") == []


class Answering:
    """Any API call, answered with an empty object; the calls' names are recorded."""

    def __init__(self, called: list[str]) -> None:
        self.called = called

    def __getattr__(self, name: str):
        self.called.append(name)
        return lambda *args, **kwargs: SimpleNamespace(data=b"{}")


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
