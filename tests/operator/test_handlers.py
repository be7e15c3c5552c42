"""The handlers' edge: a spec they cannot serve becomes the InvalidSpec condition, children's
names taken by objects the service does not control become the OwnershipConflict condition
with nothing written, old ConfigMaps go once nothing uses them, and the operator's storage
settings reach the rendered pods. The Kubernetes client and kopf's event poster are the
neighbours stubbed out; parsing, rendering, ownership and the conditions are real."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import pytest

from inference_operator import claims, handlers, render
from inference_operator.config import OperatorConfig
from inference_operator.metrics_scrape import OVER_CAP, MetricsUnreadable, ScrapeRound
from infergrid.engine_metrics import EngineSample
from infergrid.tracks import MAX_NAME_WITH_CANARY

MODEL = {"name": "m", "storageUri": "pkg://m"}


class RecordingKube:
    """Kube's calls the handlers make here, answered like the API server would from the
    objects in `objects` (by kind and name)."""

    def __init__(self) -> None:
        self.status: list[dict[str, Any]] = []
        self.applied: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str, str]] = []
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.owner: dict[str, Any] | None = None
        self.replicaset_list: list[dict[str, Any]] = []

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.status.append(status)

    def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((kind, name))

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(manifest)
        return {**manifest, "metadata": {**manifest["metadata"], "generation": 1}}

    def delete(self, kind: str, namespace: str, name: str, uid: str) -> bool:
        self.deleted.append((kind, name, uid))
        return True

    def service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.owner

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for (k, _), o in self.objects.items() if k == kind]

    def configmaps(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return self.of_kind("ConfigMap")

    def claim_templates(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return self.of_kind("ResourceClaimTemplate")

    def deployments(self, namespace: str, name: str) -> dict[str, dict[str, Any]]:
        return {d["metadata"]["name"]: d for d in self.of_kind("Deployment")}

    def replicasets(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return self.replicaset_list

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return []


@pytest.fixture
def events(monkeypatch) -> list[dict[str, Any]]:
    posted: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "warn", lambda body, **kw: posted.append(kw))
    monkeypatch.setattr(kopf, "info", lambda body, **kw: posted.append(kw))
    return posted


def memo(**config: Any) -> kopf.Memo:
    return kopf.Memo(
        config=OperatorConfig(**config), kube=RecordingKube(), applied={}, refused=set()
    )


def service(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "infergrid.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "ns", "uid": "u-1", "generation": 1},
        "spec": {"model": MODEL, "resources": {"gpus": 1}, **spec},
    }


def refused(m: kopf.Memo, body: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The conditions written for a refused spec, by type."""
    with pytest.raises(kopf.PermanentError):
        handlers._spec_or_report(m, body)
    (patch,) = m.kube.status
    return {c["type"]: c for c in patch["conditions"]}


def test_hf_without_the_operators_cache_or_downloads_shows_as_invalid_spec(events):
    body = service(canary={"storageUri": "hf://org/model", "trafficPercent": 10})
    message = refused(memo(), body)["Ready"]["message"]
    assert message.startswith("spec.canary.storageUri: ")
    assert "hfCacheClaim" in message and "allowModelDownload" in message


def test_a_canary_on_a_name_too_long_for_the_gateway_shows_as_invalid_spec(events):
    body = service(canary={"storageUri": "pkg://c", "trafficPercent": 10})
    body["metadata"]["name"] = "a" * (MAX_NAME_WITH_CANARY + 1)
    conditions = refused(memo(), body)
    assert conditions["Ready"]["reason"] == "InvalidSpec"
    assert conditions["Ready"]["message"].startswith("spec.canary: ")


@pytest.mark.parametrize(
    ("priority_class", "allowed"),
    [("system-cluster-critical", ("system-cluster-critical",)), ("urgent", ("batch",))],
)
def test_a_priority_class_the_operator_does_not_allow_shows_as_invalid_spec(
    events, priority_class, allowed
):
    body = service(scheduling={"priorityClassName": priority_class})
    conditions = refused(memo(allowed_priority_classes=allowed), body)
    assert conditions["Ready"]["reason"] == "InvalidSpec"
    assert conditions["Ready"]["message"].startswith(
        f"spec.scheduling.priorityClassName: {priority_class!r}"
    )


def test_an_allowed_priority_class_reaches_the_rendered_pods(events):
    m = memo(allowed_priority_classes=("batch",))
    body = service(scheduling={"priorityClassName": "batch"})
    handlers.apply_children(m, body, handlers._spec_or_report(m, body))
    (deployment,) = [c for c in m.kube.applied if c["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["priorityClassName"] == "batch"
    assert not events


def test_the_operators_storage_settings_reach_the_rendered_pods(events):
    m = memo(hf_cache_claim="hf-cache")
    body = service(model={"name": "m", "storageUri": "hf://org/model"})
    handlers.apply_children(m, body, handlers._spec_or_report(m, body))
    (deployment,) = [c for c in m.kube.applied if c["kind"] == "Deployment"]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    claim = {"claimName": "hf-cache", "readOnly": True}
    assert {"name": "hf-home", "persistentVolumeClaim": claim} in volumes
    assert not events


def found(name: str, owner_uid: str | None, owner_name: str = "chat", **meta: Any) -> dict:
    """An object as the API returns it, controlled by `owner_uid` (None: by no one)."""
    refs = [{"kind": "InferenceService", "name": owner_name, "uid": owner_uid,
             "controller": True}] if owner_uid else []  # fmt: skip
    return {"metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "7",
                         "ownerReferences": refs, **meta}}  # fmt: skip


def conflict(m: kopf.Memo, body: dict[str, Any]) -> dict[str, str]:
    """The Ready condition written for a service whose children's names are taken."""
    with pytest.raises(kopf.PermanentError):
        handlers._apply_or_report(m, body, handlers._parse(m, body))
    (patch,) = m.kube.status
    return {c["type"]: c for c in patch["conditions"]}["Ready"]


def test_a_service_named_after_an_unowned_service_is_refused_and_nothing_is_written(events):
    m = memo()
    body = service()
    m.kube.objects[("Service", "chat")] = found("chat", None)
    ready = conflict(m, body)
    assert (ready["status"], ready["reason"]) == ("False", "OwnershipConflict")
    assert ready["message"].startswith("Service/chat exists and no controller owns it")
    assert m.kube.applied == [] and m.kube.deleted == []
    assert events == [{"reason": "OwnershipConflict", "message": ready["message"]}]
    assert ("ns", "chat") in m.refused


def test_a_canary_colliding_with_another_services_deployment_is_one_conflict(events):
    """`a` with a canary beside a service `a-canary`: the later one is refused, naming the
    Deployment and whose it is; a permanent error, not a retry loop."""
    m = memo()
    body = service(canary={"storageUri": "pvc://c", "trafficPercent": 10})
    m.kube.objects[("Deployment", "chat")] = found("chat", "u-1")
    m.kube.objects[("Deployment", "chat-canary")] = found("chat-canary", "u-2", "chat-canary")
    ready = conflict(m, body)
    assert ready["message"].startswith(
        "Deployment/chat-canary exists and belongs to InferenceService/chat-canary"
    )
    assert m.kube.applied == []
    assert len(events) == 1


def test_the_services_own_children_are_applied(events):
    m = memo()
    body = service()
    m.kube.objects[("Deployment", "chat")] = found("chat", "u-1")
    handlers._apply_or_report(m, body, handlers._parse(m, body))
    kinds = sorted(c["kind"] for c in m.kube.applied)
    assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service"]
    assert not m.refused and not events


def test_a_refused_service_keeps_its_conflict_in_status_until_a_reconcile_succeeds(events):
    m = memo()
    m.refused.add(("ns", "chat"))
    m.kube.owner = service()
    handlers._write_status(m, "ns", "chat")
    assert m.kube.status == []


def test_only_the_services_own_stale_canary_is_deleted_and_only_the_one_read(events):
    m = memo()
    body = service()
    m.kube.objects[("Deployment", "chat-canary")] = found("chat-canary", None)  # someone's
    handlers.apply_children(m, body, handlers._parse(m, body))
    assert m.kube.deleted == []
    m.kube.objects[("Deployment", "chat-canary")] = found("chat-canary", "u-1")
    handlers.apply_children(m, body, handlers._parse(m, body))
    assert m.kube.deleted == [("Deployment", "chat-canary", "uid-chat-canary")]
    assert events == [{"reason": "Deleted", "message": "Deployment chat-canary: no canary in spec"}]


def test_old_configmaps_go_once_nothing_uses_them(events):
    m = memo()
    body = service()
    m.kube.owner = body
    current = render.configmap_name(handlers._parse(m, body), "chat", "stable")
    for name, owner in ((current, "u-1"), ("chat-stable-old", "u-1"),
                        ("chat-stable-rolling", "u-1"), ("theirs", "u-2")):  # fmt: skip
        m.kube.objects[("ConfigMap", name)] = found(name, owner)
    template = {"spec": {"volumes": [{"name": "c", "configMap": {"name": "chat-stable-rolling"}}]}}
    m.kube.replicaset_list = [{"spec": {"replicas": 1, "template": template}}]
    handlers.collect_unused(m, "ns", "chat")
    assert m.kube.deleted == [("ConfigMap", "chat-stable-old", "uid-chat-stable-old")]


def test_old_claim_templates_go_once_nothing_uses_them(events):
    """A template's spec is immutable, so a changed claim is a new one; the old one goes like
    an old ConfigMap."""
    m = memo()
    body = service(resources={"claims": [{"name": "gpu", "kind": "share", "memory": "8Gi"}]})
    m.kube.owner = body
    (claim,) = handlers._parse(m, body).resources.claims
    current = claims.template_name("chat", claim)
    for name, owner in ((current, "u-1"), ("chat-gpu-old", "u-1"),
                        ("chat-gpu-rolling", "u-1"), ("theirs", "u-2")):  # fmt: skip
        m.kube.objects[("ResourceClaimTemplate", name)] = found(name, owner)
    rolling = {"name": "gpu", "resourceClaimTemplateName": "chat-gpu-rolling"}
    template = {"spec": {"resourceClaims": [rolling]}}
    m.kube.replicaset_list = [{"spec": {"replicas": 1, "template": template}}]
    handlers.collect_unused(m, "ns", "chat")
    assert m.kube.deleted == [("ResourceClaimTemplate", "chat-gpu-old", "uid-chat-gpu-old")]


def running(pod: str) -> dict[str, Any]:
    return {
        "metadata": {"name": pod, "namespace": "ns"},
        "status": {"phase": "Running", "podIP": "10.0.0.1"},
    }


def test_a_pod_whose_metrics_are_ignored_is_named_in_one_event_and_the_others_still_scale(
    events, monkeypatch
):
    m = memo()
    scaled: list[int] = []
    m.kube.pods = lambda namespace, selector: [running("chat-a"), running("chat-huge")]
    m.kube.scale = lambda namespace, name, replicas: scaled.append(replicas)
    scraped = ScrapeRound({"chat-a": EngineSample(queue_depth=32)}, {"chat-huge": OVER_CAP})

    async def scrape(urls: dict[str, str], timeout_s: float, names) -> ScrapeRound:
        assert set(urls) == {"chat-a", "chat-huge"}
        return scraped

    monkeypatch.setattr(handlers, "scrape", scrape)
    autoscaling = {"enabled": True, "minReplicas": 1, "maxReplicas": 4, "targetQueueDepth": 8}
    body = service(replicas=2, autoscaling=autoscaling)
    spec = handlers._parse(m, body)
    state = asyncio.run(handlers.autoscale_once(m, body, spec, handlers.ScalerState()))
    assert scaled == [4]  # chat-a alone carries 4x the target
    asyncio.run(handlers.autoscale_once(m, body, spec, state))  # still ignored: no new event
    assert [e for e in events if e["reason"] == "MetricsIgnored"] == [
        {
            "reason": "MetricsIgnored",
            "message": f"pod chat-huge: {OVER_CAP}; the autoscaler ignores its metrics",
        }
    ]


GATEWAY = "http://gateway.infergrid.svc:9090/metrics"
TO_ZERO = {"enabled": True, "minReplicas": 0, "maxReplicas": 4, "targetQueueDepth": 8}


def idle_at_zero(monkeypatch, answers: list[float | Exception]) -> tuple[kopf.Memo, list[int]]:
    """A service at 0 replicas with no pod, and a gateway answering `answers` in turn, read
    for ml/chat at GATEWAY within the scrape timeout; the replica counts scaled to."""
    m = memo(gateway_metrics_url=GATEWAY)
    scaled: list[int] = []
    m.kube.scale = lambda namespace, name, replicas: scaled.append(replicas)

    async def gateway_pending(url: str, namespace: str, name: str, timeout_s: float) -> float:
        assert (url, namespace, name, timeout_s) == (GATEWAY, "ns", "chat", 2.0)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(handlers, "gateway_pending", gateway_pending)
    return m, scaled


def tick(m: kopf.Memo, body: dict[str, Any], state: Any) -> Any:
    return asyncio.run(handlers.autoscale_once(m, body, handlers._parse(m, body), state))


def test_a_request_pending_at_the_gateway_scales_a_service_up_from_zero(events, monkeypatch):
    m, scaled = idle_at_zero(monkeypatch, [0, 1])
    body = service(replicas=0, autoscaling=TO_ZERO)
    state = tick(m, body, handlers.ScalerState())
    assert scaled == [] and m.kube.status[-1]["metrics"]["pendingRequests"] == 0
    tick(m, body, state)
    assert scaled == [1]
    assert m.kube.status[-1]["metrics"]["pendingRequests"] == 1
    assert events[-1] == {
        "reason": "Scaled",
        "message": "0 -> 1 replicas: 1 requests pending at the gateway",
    }


def test_an_unreadable_gateway_counts_no_pending_request_and_warns_once_a_streak(
    events, monkeypatch, caplog
):
    down = MetricsUnreadable("no answer: refused")
    m, scaled = idle_at_zero(monkeypatch, [down, down, 0, down])
    body = service(replicas=0, autoscaling=TO_ZERO)
    state = handlers.ScalerState()
    with caplog.at_level(logging.INFO, logger="infergrid.operator"):
        for _ in range(4):
            state = tick(m, body, state)
    assert scaled == []
    assert [s["metrics"]["pendingRequests"] for s in m.kube.status] == [None, None, 0, None]
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    warning = (
        "WARNING",
        f"ns/chat: gateway metrics {GATEWAY} unreadable (no answer: refused); no pending "
        "requests counted until they can be read",
    )
    assert lines == [warning, ("INFO", "ns/chat: gateway metrics readable again"), warning]


def test_without_a_gateway_nothing_is_read_and_no_pending_count_is_reported(monkeypatch):
    m = memo()
    monkeypatch.setattr(handlers, "gateway_pending", None)  # a call would fail
    state = tick(m, service(replicas=0, autoscaling=TO_ZERO), handlers.ScalerState())
    assert m.kube.status[-1]["metrics"]["pendingRequests"] is None
    assert state.gateway_failing is False
