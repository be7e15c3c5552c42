"""The handlers' edge: a spec they cannot serve becomes the InvalidSpec condition, and the
operator's storage settings reach the rendered pods. The Kubernetes client and kopf's event
poster are the neighbours stubbed out; parsing, rendering and the conditions are real."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from inference_operator import handlers
from inference_operator.config import OperatorConfig

MODEL = {"name": "m", "storageUri": "pkg://m"}


class RecordingKube:
    """Kube's calls the handlers make here, answered like the API server would."""

    def __init__(self) -> None:
        self.status: list[dict[str, Any]] = []
        self.applied: list[dict[str, Any]] = []

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.status.append(status)

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(manifest)
        return {**manifest, "metadata": {**manifest["metadata"], "generation": 1}}

    def delete_deployment(self, namespace: str, name: str) -> bool:
        return False


@pytest.fixture
def events(monkeypatch) -> list[dict[str, Any]]:
    posted: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "warn", lambda body, **kw: posted.append(kw))
    return posted


def memo(**config: Any) -> kopf.Memo:
    return kopf.Memo(config=OperatorConfig(**config), kube=RecordingKube(), applied={})


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


def test_more_than_one_gpu_shows_as_invalid_spec_with_the_reason(events):
    m = memo()
    conditions = refused(m, service(resources={"gpus": 2}))
    for kind, status in (("Ready", "False"), ("Degraded", "True")):
        condition = conditions[kind]
        assert (condition["status"], condition["reason"]) == (status, "InvalidSpec")
        assert condition["message"].startswith("spec.resources.gpus: ")
        assert "no tensor parallelism" in condition["message"]
        assert "use gpus: 1 and more replicas" in condition["message"]
    assert events == [{"reason": "InvalidSpec", "message": conditions["Ready"]["message"]}]


def test_hf_without_the_operators_cache_or_downloads_shows_as_invalid_spec(events):
    body = service(canary={"storageUri": "hf://org/model", "trafficPercent": 10})
    message = refused(memo(), body)["Ready"]["message"]
    assert message.startswith("spec.canary.storageUri: ")
    assert "hfCacheClaim" in message and "allowModelDownload" in message


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
