"""The catalog: which ready pods of which track serve which model."""

from __future__ import annotations

import pytest

from gateway.catalog import build_catalog
from infergrid.tracks import CANARY, STABLE


def service(name, model, *, namespace="ml", created="2026-01-01T00:00:00Z", canary=None,
            replicas=1, deleting=False):  # fmt: skip
    meta = {"name": name, "namespace": namespace, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = created
    spec = {"model": {"name": model}, "replicas": replicas}
    if canary is not None:
        spec["canary"] = {"storageUri": "pkg://x", "trafficPercent": canary}
    return {"metadata": meta, "spec": spec}


def endpoint(pod, ip, ready=True, terminating=False):
    return {"addresses": [ip], "targetRef": {"kind": "Pod", "name": pod},
            "conditions": {"ready": ready, "terminating": terminating}}  # fmt: skip


def endpoint_slice(service_name, *endpoints, namespace="ml", port=8000, port_name="http"):
    """A slice as Kubernetes' endpoint controller writes it for the Service."""
    return {
        "metadata": {"namespace": namespace, "name": f"{service_name}-abcde",
                     "labels": {"kubernetes.io/service-name": service_name,
                                "endpointslice.kubernetes.io/managed-by":
                                    "endpointslice-controller.k8s.io"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Service",
                                          "name": service_name, "uid": "u1",
                                          "controller": True}]},
        "ports": [{"name": port_name, "port": port}],
        "endpoints": list(endpoints),
    }  # fmt: skip


def forged(slice_: dict, *, label: str | None = None, owner: dict | None = None) -> dict:
    """The slice with its managed-by label replaced (None: removed) and its owners `owner`."""
    meta = {**slice_["metadata"], "labels": dict(slice_["metadata"]["labels"])}
    meta["labels"].pop("endpointslice.kubernetes.io/managed-by")
    if label is not None:
        meta["labels"]["endpointslice.kubernetes.io/managed-by"] = label
    meta["ownerReferences"] = [owner] if owner else []
    return {**slice_, "metadata": meta}


@pytest.mark.parametrize(
    ("label", "owner"),
    [
        (None, {"kind": "Service", "name": "chat", "controller": True}),
        ("someone-else", {"kind": "Service", "name": "chat", "controller": True}),
        ("endpointslice-controller.k8s.io", None),
        ("endpointslice-controller.k8s.io", {"kind": "Service", "name": "web", "controller": True}),
        ("endpointslice-controller.k8s.io", {"kind": "Service", "name": "chat"}),
    ],
    ids=["no-label", "other-manager", "no-owner", "other-service", "not-controller"],
)
def test_a_slice_the_endpoint_controller_did_not_make_for_the_service_routes_nothing(label, owner):
    """A tenant who may write EndpointSlices labels one with the service's name, pointing at
    an address it wants the gateway to call (another tenant's engine, a metadata service)."""
    real = endpoint_slice("chat", endpoint("chat-7d9f8b6c5-x2kzq", "10.0.0.5"))
    fake = forged(endpoint_slice("chat", endpoint("chat-7d9f8b6c5-evil1", "169.254.169.254")),
                  label=label, owner=owner)  # fmt: skip
    route = build_catalog([service("chat", "m")], [real, fake]).routes["m"]
    assert [b.url for b in route.backends] == ["http://10.0.0.5:8000"]


def test_a_model_is_served_by_the_ready_pods_of_its_service_with_their_tracks():
    pods = (
        endpoint("chat-7d9f8b6c5-x2kzq", "10.0.0.5"),
        endpoint("chat-canary-5b7c9d8f4-bcdfg", "10.0.0.6"),
        endpoint("chat-7d9f8b6c5-qqqqq", "10.0.0.7", ready=False),
    )
    slices = [endpoint_slice("chat", *pods)]
    catalog = build_catalog([service("chat", "smollm2", canary=10)], slices)
    route = catalog.routes["smollm2"]
    assert route.canary_percent == 10
    assert [(b.pod, b.url, b.track) for b in route.backends] == [
        ("chat-7d9f8b6c5-x2kzq", "http://10.0.0.5:8000", STABLE),
        ("chat-canary-5b7c9d8f4-bcdfg", "http://10.0.0.6:8000", CANARY),
    ]
    assert route.weights() == {STABLE: 90, CANARY: 10}


def test_a_track_without_a_ready_pod_gets_no_weight_and_a_zero_weight_track_serves_only_alone():
    only_canary = [endpoint_slice("chat", endpoint("chat-canary-5b7c9d8f4-bcdfg", "10.0.0.6"))]
    route = build_catalog([service("chat", "m", canary=10)], only_canary).routes["m"]
    assert route.weights() == {CANARY: 10}
    both = [endpoint_slice("chat", endpoint("chat-canary-5b7c9d8f4-bcdfg", "10.0.0.6"),
                           endpoint("chat-7d9f8b6c5-x2kzq", "10.0.0.5"))]  # fmt: skip
    assert build_catalog([service("chat", "m", canary=0)], both).routes["m"].weights() == {
        STABLE: 100
    }
    assert build_catalog([service("chat", "m", canary=100)], both).routes["m"].weights() == {
        CANARY: 100
    }


def test_terminating_pods_pods_of_other_deployments_and_other_ports_are_not_backends():
    slices = [
        endpoint_slice("chat", endpoint("chat-7d9f8b6c5-x2kzq", "10.0.0.5", terminating=True),
                       endpoint("debug-shell", "10.0.0.9")),
        endpoint_slice("chat", endpoint("chat-7d9f8b6c5-bbbbb", "10.0.0.8"), port_name="grpc"),
    ]  # fmt: skip
    assert build_catalog([service("chat", "m")], slices).routes["m"].backends == ()


def test_pods_are_matched_to_the_service_of_their_namespace():
    slices = [endpoint_slice("chat", endpoint("chat-7d9f8b6c5-x2kzq", "10.0.0.5"), namespace="a")]
    catalog = build_catalog([service("chat", "m", namespace="b")], slices)
    assert catalog.routes["m"].backends == ()


def test_ipv6_addresses_are_bracketed_in_urls():
    slices = [endpoint_slice("chat", endpoint("chat-7d9f8b6c5-x2kzq", "fd00::5"))]
    route = build_catalog([service("chat", "m")], slices).routes["m"]
    assert route.backends[0].url == "http://[fd00::5]:8000"


def test_the_oldest_service_keeps_a_model_name_and_the_newer_one_is_reported():
    old = service("chat", "m", namespace="team-a", created="2026-01-01T00:00:00Z")
    new = service("chat", "m", namespace="team-b", created="2026-02-01T00:00:00Z")
    catalog = build_catalog([new, old], [])
    assert catalog.routes["m"].namespace == "team-a"
    assert catalog.shadowed == ("team-b/chat names model 'm', already served by team-a/chat",)


def test_a_service_being_deleted_or_without_a_model_name_is_not_routed():
    nameless = {"metadata": {"name": "x", "namespace": "ml"}, "spec": {"model": {}}}
    catalog = build_catalog([service("a", "m", deleting=True), nameless], [])
    assert catalog.routes == {}


def test_replicas_at_zero_are_kept_for_scale_from_zero():
    assert build_catalog([service("a", "m", replicas=0)], []).routes["m"].replicas == 0
