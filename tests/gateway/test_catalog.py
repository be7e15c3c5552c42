"""The catalog: which ready pods of which track serve which model, and only at the address
of a live engine pod of the service, whatever an EndpointSlice says."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.catalog import EnginePod, build_catalog
from infergrid.constants import LABEL_INFERENCESERVICE
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


def pod(name, *ips, namespace="ml", service="chat", terminating=False) -> EnginePod:
    """An engine pod as the gateway holds it, from the pod the API server sends."""
    meta = {"name": name, "namespace": namespace, "labels": {}}
    if service is not None:
        meta["labels"][LABEL_INFERENCESERVICE] = service
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status = {"podIP": ips[0], "podIPs": [{"ip": ip} for ip in ips]} if ips else {}
    return EnginePod.of({"metadata": meta, "status": status})


def pods_behind(slices) -> list[EnginePod]:
    """The pods a real slice lists: each endpoint's, at its address, with its Service's label."""
    return [
        pod(e["targetRef"]["name"], *e["addresses"], namespace=s["metadata"]["namespace"],
            service=s["metadata"]["labels"]["kubernetes.io/service-name"])
        for s in slices for e in s["endpoints"]
    ]  # fmt: skip


def catalog_of(services, slices):
    """The catalog when every endpoint of `slices` is the real pod it names."""
    return build_catalog(services, slices, pods_behind(slices))


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
    catalog = build_catalog([service("chat", "m")], [real, fake], pods_behind([real]))
    assert [b.url for b in catalog.routes["ml", "m"].backends] == ["http://10.0.0.5:8000"]


REAL = pod("chat-7d9f8b6c5-x2kzq", "10.0.0.5")


@pytest.mark.parametrize(
    ("forged_endpoint", "pods", "why"),
    [
        (endpoint("chat-7d9f8b6c5-evil1", "169.254.169.254"), [], "targets no engine pod of ml"),
        (endpoint("chat-7d9f8b6c5-x2kzq", "10.0.9.9"), [], "address ['10.0.9.9'], not the pod's"),
        (endpoint("chat-7d9f8b6c5-bbbbb", "10.0.7.7"),
         [pod("chat-7d9f8b6c5-bbbbb", "10.0.7.7", namespace="victim")], "no engine pod of ml"),
        ({**endpoint("chat-7d9f8b6c5-bbbbb", "10.0.7.7"),
          "targetRef": {"kind": "Pod", "name": "chat-7d9f8b6c5-bbbbb", "namespace": "victim"}},
         [pod("chat-7d9f8b6c5-bbbbb", "10.0.7.7", namespace="victim")], "of namespace victim"),
        (endpoint("chat-7d9f8b6c5-bbbbb", "10.0.7.7"),
         [pod("chat-7d9f8b6c5-bbbbb", "10.0.7.7", service="web")],
         f"does not carry {LABEL_INFERENCESERVICE}=chat"),
        (endpoint("chat-7d9f8b6c5-bbbbb", "10.0.7.7"),
         [pod("chat-7d9f8b6c5-bbbbb", "10.0.7.7", service=None)], "does not carry"),
        ({**endpoint("node-1", "10.0.7.7"), "targetRef": {"kind": "Node", "name": "node-1"}},
         [], "targets Node, not a Pod"),
        (endpoint("chat-7d9f8b6c5-x2kzq", "metadata.google.internal"), [], "not the pod's IP"),
    ],
    ids=["no-pod", "not-the-pods-ip", "other-namespaces-pod", "ref-to-other-namespace",
         "other-services-pod", "unlabelled-pod", "a-node", "a-hostname"],
)  # fmt: skip
def test_a_slice_forged_in_every_field_routes_nothing_but_the_services_own_pods(
    forged_endpoint, pods, why
):
    """The tenant's slice reads as the endpoint controller's own (its labels, managed-by, the
    Service as controlling owner), but names an address that is not a live pod of the service
    in that namespace: it is refused, and reported once with the reason."""
    fake = endpoint_slice("chat", forged_endpoint)
    fake["metadata"]["name"] = "chat-forged"
    catalog = build_catalog([service("chat", "m")], [fake], [REAL, *pods])
    assert catalog.routes["ml", "m"].backends == ()
    assert list(catalog.refused) == [("ml", "chat-forged")]
    assert why in catalog.refused["ml", "chat-forged"]


def test_a_forged_slice_may_name_the_services_own_pod_at_its_own_address():
    """All a slice can still do: list a pod the endpoint controller would list anyway."""
    fake = endpoint_slice("chat", endpoint("chat-7d9f8b6c5-x2kzq", "10.0.0.5"))
    catalog = build_catalog([service("chat", "m")], [fake], [REAL])
    assert [b.url for b in catalog.routes["ml", "m"].backends] == ["http://10.0.0.5:8000"]
    assert catalog.refused == {}


def test_a_forged_slice_cannot_aim_at_another_port_of_the_services_own_pod():
    """A hostNetwork pod's IP is its node's: any other port there would be the node's."""
    fake = endpoint_slice("chat", endpoint("chat-7d9f8b6c5-x2kzq", "10.0.0.5"), port=10250)
    assert build_catalog([service("chat", "m")], [fake], [REAL]).routes["ml", "m"].backends == ()


def test_a_terminating_pod_is_no_backend_even_while_its_slice_still_calls_it_ready():
    """The pod watch and the slice watch race at every rollout: not a forgery, not reported."""
    real = endpoint_slice("chat", endpoint("chat-7d9f8b6c5-x2kzq", "10.0.0.5"))
    going = pod("chat-7d9f8b6c5-x2kzq", "10.0.0.5", terminating=True)
    catalog = build_catalog([service("chat", "m")], [real], [going])
    assert catalog.routes["ml", "m"].backends == ()
    assert catalog.refused == {}


def test_a_dual_stack_pods_every_ip_counts_in_any_spelling():
    slices = [endpoint_slice("chat", endpoint("chat-7d9f8b6c5-x2kzq", "fd00:0:0::5"))]
    both = pod("chat-7d9f8b6c5-x2kzq", "10.0.0.5", "fd00::5")
    route = build_catalog([service("chat", "m")], slices, [both]).routes["ml", "m"]
    assert [b.url for b in route.backends] == ["http://[fd00::5]:8000"]


def test_the_gateway_holds_of_a_pod_only_what_the_endpoint_check_reads():
    full = {
        "metadata": {"name": "chat-7d9f8b6c5-x2kzq", "namespace": "ml",
                     "labels": {LABEL_INFERENCESERVICE: "chat", "infergrid.io/track": "stable"},
                     "annotations": {"big": "x" * 1000}, "managedFields": [{}]},
        "spec": {"containers": [{"name": "engine", "env": [{"name": "A", "value": "b"}]}]},
        "status": {"podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}], "hostIP": "10.1.0.1"},
    }  # fmt: skip
    assert EnginePod.of(full) == EnginePod("ml", "chat-7d9f8b6c5-x2kzq", "chat",
                                           frozenset({"10.0.0.5"}), terminating=False)  # fmt: skip
    assert EnginePod.of({"metadata": {"name": "p", "namespace": "ml"}}).ips == frozenset()


NAMESPACES = ("ml", "victim")
SERVICES = ("chat", "web")
NAMES = tuple(f"{s}-7d9f8b6c5-{x}" for s in SERVICES for x in ("bbbbb", "ccccc")) + ("evil",)
IPS = ("10.0.0.1", "10.0.0.2", "10.0.0.3", "169.254.169.254", "fd00::1")

pods_st = st.lists(
    st.builds(
        lambda ns, name, svc, ips, going: pod(name, *ips, namespace=ns, service=svc,
                                              terminating=going),
        st.sampled_from(NAMESPACES), st.sampled_from(NAMES),
        st.sampled_from((*SERVICES, None)), st.lists(st.sampled_from(IPS), max_size=2),
        st.booleans(),
    ),
    max_size=6,
)  # fmt: skip
endpoint_st = st.builds(
    lambda name, ip, kind, ref_ns, ready: {
        "addresses": [ip], "conditions": {"ready": ready},
        "targetRef": {"kind": kind, "name": name, **({"namespace": ref_ns} if ref_ns else {})},
    },
    st.sampled_from(NAMES), st.sampled_from(IPS), st.sampled_from(("Pod", "Node")),
    st.sampled_from((None, *NAMESPACES)), st.booleans(),
)  # fmt: skip
slices_st = st.lists(
    st.builds(
        lambda ns, svc, eps: endpoint_slice(svc, *eps, namespace=ns),
        st.sampled_from(NAMESPACES), st.sampled_from(SERVICES), st.lists(endpoint_st, max_size=4),
    ),
    max_size=4,
)  # fmt: skip


@given(pods_st, slices_st)
def test_every_backend_is_at_the_ip_of_a_live_pod_of_its_service_in_its_namespace(pods, slices):
    services = [service(s, f"model-{s}", namespace=ns) for ns in NAMESPACES for s in SERVICES]
    held = {p.key: p for p in pods}  # one pod per name, as the watch holds them
    catalog = build_catalog(services, slices, held.values())
    for route in catalog.routes.values():
        for backend in route.backends:
            owner = held[route.namespace, backend.pod]
            assert not owner.terminating
            assert owner.service == route.service
            assert str(ipaddress.ip_address(urlsplit(backend.url).hostname)) in owner.ips


def test_a_model_is_served_by_the_ready_pods_of_its_service_with_their_tracks():
    pods = (
        endpoint("chat-7d9f8b6c5-x2kzq", "10.0.0.5"),
        endpoint("chat-canary-5b7c9d8f4-bcdfg", "10.0.0.6"),
        endpoint("chat-7d9f8b6c5-qqqqq", "10.0.0.7", ready=False),
    )
    slices = [endpoint_slice("chat", *pods)]
    catalog = catalog_of([service("chat", "smollm2", canary=10)], slices)
    route = catalog.routes["ml", "smollm2"]
    assert route.canary_percent == 10
    assert [(b.pod, b.url, b.track) for b in route.backends] == [
        ("chat-7d9f8b6c5-x2kzq", "http://10.0.0.5:8000", STABLE),
        ("chat-canary-5b7c9d8f4-bcdfg", "http://10.0.0.6:8000", CANARY),
    ]
    assert route.weights() == {STABLE: 90, CANARY: 10}


def test_a_track_without_a_ready_pod_gets_no_weight_and_a_zero_weight_track_serves_only_alone():
    only_canary = [endpoint_slice("chat", endpoint("chat-canary-5b7c9d8f4-bcdfg", "10.0.0.6"))]
    route = catalog_of([service("chat", "m", canary=10)], only_canary).routes["ml", "m"]
    assert route.weights() == {CANARY: 10}
    both = [endpoint_slice("chat", endpoint("chat-canary-5b7c9d8f4-bcdfg", "10.0.0.6"),
                           endpoint("chat-7d9f8b6c5-x2kzq", "10.0.0.5"))]  # fmt: skip
    assert catalog_of([service("chat", "m", canary=0)], both).routes["ml", "m"].weights() == {
        STABLE: 100
    }
    assert catalog_of([service("chat", "m", canary=100)], both).routes["ml", "m"].weights() == {
        CANARY: 100
    }


def test_terminating_pods_pods_of_other_deployments_and_other_ports_are_not_backends():
    slices = [
        endpoint_slice("chat", endpoint("chat-7d9f8b6c5-x2kzq", "10.0.0.5", terminating=True),
                       endpoint("debug-shell", "10.0.0.9")),
        endpoint_slice("chat", endpoint("chat-7d9f8b6c5-bbbbb", "10.0.0.8"), port_name="grpc"),
    ]  # fmt: skip
    assert catalog_of([service("chat", "m")], slices).routes["ml", "m"].backends == ()


def test_pods_are_matched_to_the_service_of_their_namespace():
    slices = [endpoint_slice("chat", endpoint("chat-7d9f8b6c5-x2kzq", "10.0.0.5"), namespace="a")]
    catalog = catalog_of([service("chat", "m", namespace="b")], slices)
    assert catalog.routes["b", "m"].backends == ()


def test_ipv6_addresses_are_bracketed_in_urls():
    slices = [endpoint_slice("chat", endpoint("chat-7d9f8b6c5-x2kzq", "fd00::5"))]
    route = catalog_of([service("chat", "m")], slices).routes["ml", "m"]
    assert route.backends[0].url == "http://[fd00::5]:8000"


def test_two_namespaces_serve_one_model_name_side_by_side():
    """Model names are the tenants' own: a newer namespace naming the same model shadows
    nothing, and is reached only by those who may call it (test_model_names.py)."""
    old = service("chat", "m", namespace="team-b", created="2026-01-01T00:00:00Z")
    new = service("squat", "m", namespace="team-a", created="2026-02-01T00:00:00Z")
    catalog = build_catalog([new, old], [], [])
    assert {k: r.service for k, r in catalog.routes.items()} == {
        ("team-a", "m"): "squat",
        ("team-b", "m"): "chat",
    }
    assert [r.namespace for r in catalog.by_model["m"]] == ["team-a", "team-b"]
    assert catalog.shadowed == ()


def test_within_one_namespace_the_oldest_service_keeps_a_model_name_and_the_newer_is_reported():
    old = service("chat", "m", namespace="team-a", created="2026-01-01T00:00:00Z")
    new = service("chat-2", "m", namespace="team-a", created="2026-02-01T00:00:00Z")
    catalog = build_catalog([new, old], [], [])
    assert catalog.routes["team-a", "m"].service == "chat"
    assert catalog.by_service.keys() == {("team-a", "chat")}
    assert catalog.shadowed == ("team-a/chat-2 names model 'm', already served by team-a/chat",)


def test_a_service_being_deleted_or_without_a_model_name_is_not_routed():
    nameless = {"metadata": {"name": "x", "namespace": "ml"}, "spec": {"model": {}}}
    catalog = build_catalog([service("a", "m", deleting=True), nameless], [], [])
    assert catalog.routes == {}


def test_replicas_at_zero_are_kept_for_scale_from_zero():
    assert build_catalog([service("a", "m", replicas=0)], [], []).routes["ml", "m"].replicas == 0


CUSTOM = {
    "runtime": "custom",
    "customRuntime": {
        "port": 9000,
        "readyPath": "/r",
        "livePath": "/l",
        "metrics": {"queueDepth": "tgi_queue_size", "running": "r"},
    },
}


@pytest.mark.parametrize(
    ("runtime", "port", "queue_series"),
    [
        ({}, 8000, "infergrid_engine_queue_depth"),
        ({"runtime": "sglang"}, 30000, "sglang:num_queue_reqs"),
        ({"runtime": "llama.cpp"}, 8080, "llamacpp:requests_deferred"),
        (CUSTOM, 9000, "tgi_queue_size"),
    ],
)  # fmt: skip
def test_each_backend_is_on_its_runtimes_port_and_read_in_its_series(runtime, port, queue_series):
    slices = [endpoint_slice("chat", endpoint("chat-7d9f8b6c5-x2kzq", "10.0.0.5"), port=port)]
    svc = service("chat", "qwen")
    svc["spec"].update(runtime)
    (backend,) = catalog_of([svc], slices).routes["ml", "qwen"].backends
    assert backend.metrics.queue_depth == queue_series
    assert backend.url == f"http://10.0.0.5:{port}"


@pytest.mark.parametrize(
    "runtime",
    [
        {"runtime": "sglang"},
        {"runtime": "tgi"},
        {"runtime": "custom", "customRuntime": {"port": 1}},
    ],
    ids=["another-runtimes-port", "unknown-runtime", "bad-custom-runtime"],
)
def test_a_slice_on_a_port_not_the_runtimes_routes_nothing(runtime):
    """sglang listens on 30000: a slice naming 8000 aims at no engine; a spec the API
    server would refuse is read as the bundled engine's, whose port the slice does not name."""
    slices = [endpoint_slice("chat", endpoint("chat-7d9f8b6c5-x2kzq", "10.0.0.5"),
                             port=8000 if runtime == {"runtime": "sglang"} else 30000)]  # fmt: skip
    svc = service("chat", "qwen")
    svc["spec"].update(runtime)
    assert catalog_of([svc], slices).routes["ml", "qwen"].backends == ()
