"""The extender over real HTTP: the kube-scheduler extender v1 JSON, and bad input of every kind."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.client.rest import ApiException

from infergrid.constants import (
    ANNOTATION_GPU_INVENTORY,
    ANNOTATION_GPU_USAGE,
    ANNOTATION_PLACEMENT_POLICY,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
)
from infergrid.fleet import load_fleet
from infergrid.inventory import encode_inventory
from infergrid.placement import idle_usage
from infergrid.usage import encode_usage
from scheduler_extender.app import MAX_BODY_BYTES, ExtenderService
from scheduler_extender.binder import Binder
from scheduler_extender.view import PlacementView
from scheduler_extender.watch_cache import ADDED, ClusterCache

NOW = datetime(2026, 1, 1, tzinfo=UTC)
FLEET = load_fleet(Path(__file__).resolve().parents[2] / "e2e" / "fleets" / "sample.yaml")
NAMES = [n.name for n in FLEET.nodes]


class MissingPods:
    """The API server across the seam: every pod read is a 404."""

    def read_namespaced_pod(self, name, namespace, **_):
        raise ApiException(status=404, reason="Not Found")


def service(leader: bool = True) -> ExtenderService:
    cache = ClusterCache()
    for node in FLEET.nodes:
        annotations = {
            ANNOTATION_GPU_INVENTORY: encode_inventory(node.inventory),
            ANNOTATION_GPU_USAGE: encode_usage(idle_usage(node.inventory, NOW)),
        }
        cache.apply_node(ADDED, {"metadata": {"name": node.name, "annotations": annotations}})
    cache.apply_node(
        ADDED,
        {"metadata": {"name": "broken", "annotations": {ANNOTATION_GPU_INVENTORY: "{not json"}}},
    )
    view = PlacementView(cache, timedelta(seconds=30))
    binder = Binder(MissingPods(), view, "binpack")
    return ExtenderService(view, binder, "binpack", lambda: leader, clock=lambda: NOW)


def share_pod(mib: int, annotations: dict | None = None) -> dict:
    limits = {RESOURCE_VGPU: "1", RESOURCE_GPU_MEMORY: str(mib)}
    return {
        "metadata": {"name": "p", "namespace": "default", "uid": "u1",
                     "annotations": annotations or {}},
        "spec": {"containers": [{"name": "engine", "resources": {"limits": limits}}]},
    }  # fmt: skip


def call(svc: ExtenderService, path: str, body: bytes | dict) -> tuple[int, object]:
    async def go():
        async with TestClient(TestServer(svc.app())) as http:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            resp = await http.post(path, data=data)
            text = await resp.text()
            return resp.status, (json.loads(text) if text.startswith(("{", "[")) else text)

    return asyncio.run(go())


def test_filter_passes_nodes_with_room_and_gives_every_other_node_its_reason():
    status, result = call(service(), "/filter", {"Pod": share_pod(30000), "NodeNames": NAMES})
    assert status == 200 and result["Error"] == ""
    assert sorted(result["NodeNames"]) == ["a100-0", "a100-1", "h100", "local-a100"]
    assert set(result["FailedNodes"]) == {"l4-0", "l4-1"}
    assert "23034 MiB free, needs 30000" in result["FailedNodes"]["l4-0"]


def test_unknown_and_unreadable_nodes_are_unresolvable_with_the_reason():
    status, result = call(
        service(), "/filter", {"Pod": share_pod(1024), "NodeNames": ["nowhere", "broken"]}
    )
    assert status == 200 and result["NodeNames"] == []
    unresolvable = result["FailedAndUnresolvableNodes"]
    assert "not in the extender's cache" in unresolvable["nowhere"]
    assert ANNOTATION_GPU_INVENTORY in unresolvable["broken"]


def test_an_unknown_policy_is_named_on_every_node_with_the_policies_there_are():
    """kube-scheduler records the reason as FailedScheduling: the pod asked for a policy
    that does not exist, and is never placed by another one instead."""
    pod = share_pod(1024, {ANNOTATION_PLACEMENT_POLICY: "densest"})
    _, result = call(service(), "/filter", {"Pod": pod, "NodeNames": ["l4-0", "h100"]})
    assert result["NodeNames"] == []
    for reason in result["FailedAndUnresolvableNodes"].values():
        assert reason == (
            "invalid GPU request: metadata.annotations[infergrid.io/placement-policy]: "
            "'densest' is not one of binpack, spread, fgd, fgd-cluster-aware"
        )


@pytest.mark.parametrize("asked", ["annotation", "default"])
def test_the_cluster_aware_policy_is_served_by_annotation_or_as_the_default(asked):
    svc = service()
    if asked == "annotation":
        pod = share_pod(30000, {ANNOTATION_PLACEMENT_POLICY: "fgd-cluster-aware"})
    else:
        svc.default_policy = "fgd-cluster-aware"
        pod = share_pod(30000)
    _, result = call(svc, "/filter", {"Pod": pod, "NodeNames": NAMES})
    assert sorted(result["NodeNames"]) == ["a100-0", "a100-1", "h100", "local-a100"]
    _, scores = call(svc, "/prioritize", {"Pod": pod, "NodeNames": NAMES})
    by_node = {s["Host"]: s["Score"] for s in scores}
    assert max(by_node.values()) == 10 and by_node["l4-0"] == 0


def test_prioritize_returns_a_bare_array_on_0_to_10():
    status, result = call(service(), "/prioritize", {"Pod": share_pod(4096), "NodeNames": NAMES})
    assert status == 200 and isinstance(result, list)
    assert {r["Host"] for r in result} == set(NAMES)
    assert all(0 <= r["Score"] <= 10 for r in result)
    assert max(r["Score"] for r in result) == 10


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/filter", b"{not json", "body"),
        ("/filter", b"[1, 2]", "body"),
        ("/filter", {"NodeNames": ["l4-0"]}, "Pod"),
        ("/prioritize", {"Pod": share_pod(1), "NodeNames": "l4-0"}, "NodeNames"),
        ("/filter", {"Pod": share_pod(1), "NodeNames": ["l4-0", ""]}, "NodeNames"),
        ("/filter", {"Pod": share_pod(1), "NodeNames": ["l4-0", 7]}, "NodeNames"),
        ("/filter", b'{"Pod": {"metadata": {}}, "NodeNames": [], "x": NaN}', "body"),
        ("/bind", {"PodName": "p", "PodNamespace": "default", "PodUID": "u"}, "Node"),
        ("/bind", b"", "body"),
    ],
)
def test_malformed_requests_get_400_naming_the_field(path, body, field):
    status, result = call(service(), path, body)
    assert status == 400
    assert result["Error"].startswith(f"{field}:")


def test_answers_are_utf8_json_and_every_reason_survives_the_trip():
    async def go():
        async with TestClient(TestServer(service().app())) as http:
            body = {"Pod": share_pod(1024), "NodeNames": ["nœud-ü", "l4-0"]}
            resp = await http.post("/filter", data=json.dumps(body).encode())
            return resp.headers["Content-Type"], await resp.json()

    content_type, result = asyncio.run(go())
    assert content_type == "application/json; charset=utf-8"
    assert result["NodeNames"] == ["l4-0"]
    assert (
        "node nœud-ü is not in the extender's cache"
        in result["FailedAndUnresolvableNodes"]["nœud-ü"]
    )


def test_a_10_mb_payload_is_refused_with_413():
    body = json.dumps({"Pod": share_pod(1), "NodeNames": ["x" * 1000] * 10_000}).encode()
    assert len(body) > MAX_BODY_BYTES
    status, _ = call(service(), "/filter", body)
    assert status == 413


def test_bind_of_a_missing_pod_answers_in_the_error_field():
    args = {"PodName": "gone", "PodNamespace": "default", "PodUID": "u", "Node": "l4-0"}
    status, result = call(service(), "/bind", args)
    assert status == 200 and "cannot read the pod" in result["Error"]


def test_only_the_leader_binds():
    args = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "l4-0"}
    _, result = call(service(leader=False), "/bind", args)
    assert "not the leader" in result["Error"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
envelopes = st.fixed_dictionaries(
    {},
    optional={
        "Pod": json_values | st.just(share_pod(1024)),
        "NodeNames": json_values | st.just(NAMES),
        "PodName": json_values,
        "PodNamespace": json_values,
        "PodUID": json_values,
        "Node": json_values,
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["/filter", "/prioritize", "/bind"]), envelopes | json_values)
def test_fuzzed_bodies_never_get_a_500(path, body):
    status, result = call(service(), path, json.dumps(body).encode())
    assert status in (200, 400)
    if status == 400 or isinstance(result, dict):
        assert isinstance(result, dict) and "Error" in result
