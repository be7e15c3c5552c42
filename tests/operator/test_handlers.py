"""The handlers' edge: a spec they cannot serve becomes the InvalidSpec condition. The
Kubernetes client and kopf's event poster are the neighbours stubbed out; parsing and the
conditions are real."""

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

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.status.append(status)


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
