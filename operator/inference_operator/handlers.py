"""kopf handlers: InferenceService in, Deployment + Service + ConfigMap + PDB out.

Level-based throughout: every handler reads the current state and re-applies
the rendered children, so it converges from anything (a crash mid-reconcile,
a deleted or edited Deployment) and repeating it changes nothing. There is no
delete handler: the children carry owner references, and the garbage
collector removes them with their InferenceService.

The memo carries `config` (OperatorConfig), `kube` (Kube), `refreshes` (one
Refresh per service) and `applied` (the Deployment generations this operator
last wrote, to tell its own writes from someone else's edits).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from infergrid.constants import CRD_GROUP, CRD_PLURAL, CRD_VERSION
from infergrid.errors import ContractError
from infergrid.process import kube_api

from .autoscaler import (
    History,
    ScaleDecision,
    ScalingPolicy,
    desired_replicas,
    history_after,
    ratios,
)
from .conditions import (
    compute_status,
    invalid_spec_conditions,
    observe_deployment,
    status_patch,
    transitions,
)
from .config import OperatorConfig
from .kube import Kube
from .metrics_scrape import Buckets, ServiceMetrics, aggregate, scrapable, scrape, scrape_url
from .render import (
    LABEL_SERVICE,
    ModelStorage,
    check_storage,
    render_children,
    stable_selector,
    stale_deployments,
    track_replicas,
)
from .spec import ServiceSpec, parse_spec

log = logging.getLogger("infergrid.operator")
RESOURCE = (CRD_GROUP, CRD_VERSION, CRD_PLURAL)
RETRY_DELAY_S = 5


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """kopf's own records under infergrid.io; the memo filled for `kopf run` without main."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="infergrid.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="infergrid.io", key="last-handled-configuration"
    )
    settings.persistence.finalizer = "infergrid.io/operator"
    memo.setdefault("config", OperatorConfig())
    memo.setdefault("kube", Kube(kube_api()))
    memo.setdefault("refreshes", {})
    memo.setdefault("applied", {})
    settings.execution.max_workers = memo.config.max_workers


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE)
def reconcile(
    body: kopf.Body, meta: kopf.Meta, name: str, namespace: str, patch: kopf.Patch,
    memo: kopf.Memo, **_: Any,
) -> None:  # fmt: skip
    """Applies every child as rendered from the spec, then reports what it finds."""
    service = _spec_or_report(memo, body)
    try:
        apply_children(memo, body, service)
        refresh_status(memo, namespace, name)
    except ApiException as err:
        raise kopf.TemporaryError(f"API: {err.status} {err.reason}", delay=RETRY_DELAY_S) from err
    patch.status["observedGeneration"] = meta["generation"]


@kopf.on.event("apps/v1", "deployments", labels={LABEL_SERVICE: kopf.PRESENT})
def deployment_event(
    type: str | None, body: kopf.Body, namespace: str, labels: kopf.Labels, memo: kopf.Memo,
    **_: Any,
) -> None:  # fmt: skip
    """Restores a Deployment that was deleted or edited, and reports rollout progress."""
    name = labels[LABEL_SERVICE]
    if type == "DELETED" or _edited_by_others(memo, body):
        restore(memo, namespace, name, body, deleted=type == "DELETED")
    refresh_status(memo, namespace, name)


@kopf.on.event("v1", "pods", labels={LABEL_SERVICE: kopf.PRESENT})
def pod_event(namespace: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    """A pod was scheduled, failed to be, became ready or went: the status follows."""
    refresh_status(memo, namespace, labels[LABEL_SERVICE])


def apply_children(memo: kopf.Memo, owner: dict[str, Any], service: ServiceSpec) -> dict[str, int]:
    """Server-side apply of every child, owned by the InferenceService; stale ones deleted.

    Returns each Deployment's generation after the apply.
    """
    name, namespace = owner["metadata"]["name"], owner["metadata"]["namespace"]
    children = render_children(service, name, namespace, model_storage(memo.config))
    kopf.adopt(children, owner=owner)
    generations = {}
    for child in children:
        applied = memo.kube.apply(child)
        if child["kind"] == "Deployment":
            generations[child["metadata"]["name"]] = applied["metadata"]["generation"]
            memo.applied[(namespace, child["metadata"]["name"])] = applied["metadata"]["generation"]
    for stale in stale_deployments(service, name):
        if memo.kube.delete_deployment(namespace, stale):
            announce(owner, "Deleted", f"Deployment {stale}: no canary in spec")
    return generations


def restore(
    memo: kopf.Memo, namespace: str, name: str, deployment: kopf.Body, deleted: bool
) -> None:
    """Re-applies the children of a live InferenceService; one being deleted is left alone.

    The event says what really changed: an apply that leaves the generation
    as it was undid nothing (the Deployment event was this operator's own write).
    """
    owner = memo.kube.service(namespace, name)
    if owner is None or owner["metadata"].get("deletionTimestamp"):
        return
    try:
        service = _parse(memo, owner)
    except ContractError:
        return  # reconcile has already reported it
    generations = apply_children(memo, owner, service)
    child, seen = deployment["metadata"]["name"], deployment["metadata"]["generation"]
    if child in generations and (deleted or generations[child] != seen):
        what = "deleted" if deleted else "edited"
        announce(owner, "Restored", f"Deployment {child} was {what}; re-applied")


@dataclass
class Refresh:
    """One service's status refreshes: at most one runs, and a request made meanwhile reruns it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    pending: bool = False


def refresh_status(memo: kopf.Memo, namespace: str, name: str) -> None:
    """Writes the status computed from the Deployments and pods, when it changed.

    Pod events of one service arrive on many threads at once. Rather than
    queue behind each other, a request marks the refresh pending and leaves
    it to whichever thread is refreshing, which reads the state again; so the
    last refresh always reads the state after the last event.
    """
    refresh = memo.refreshes.setdefault((namespace, name), Refresh())
    refresh.pending = True
    while refresh.pending and refresh.lock.acquire(blocking=False):
        try:
            refresh.pending = False
            _write_status(memo, namespace, name)
        finally:
            refresh.lock.release()


def _write_status(memo: kopf.Memo, namespace: str, name: str) -> None:
    owner = memo.kube.service(namespace, name)
    if owner is None or owner["metadata"].get("deletionTimestamp"):
        return
    try:
        desired = track_replicas(_parse(memo, owner))
    except ContractError:
        return  # reconcile has already reported it
    deployments = memo.kube.deployments(namespace, name)
    tracks = {t: observe_deployment(deployments.get(t), n) for t, n in desired.items()}
    pods = memo.kube.pods(namespace, f"{LABEL_SERVICE}={name}")
    current = owner.get("status") or {}
    previous = current.get("conditions") or []
    wanted = compute_status(name, namespace, tracks, pods, previous, _now())
    patch = status_patch(current, wanted)
    if patch:
        memo.kube.patch_status(namespace, name, patch)
    for kind, reason, message in transitions(previous, wanted["conditions"]):
        kopf.event(owner, type=kind, reason=reason, message=message)


@dataclass(frozen=True, slots=True)
class ScalerState:
    """What one autoscaler keeps between ticks: recommendations, latency counters, and the
    replica count it last decided (to tell a hand-set count from its own)."""

    history: History = ()
    latency: dict[str, Buckets] = field(default_factory=dict)
    replicas: int | None = None


def autoscaling_on(spec: kopf.Spec, **_: Any) -> bool:
    return bool((spec.get("autoscaling") or {}).get("enabled"))


@kopf.daemon(*RESOURCE, when=autoscaling_on, cancellation_timeout=10)
async def autoscale(
    body: kopf.Body, stopped: kopf.DaemonStopped, memo: kopf.Memo, **_: Any
) -> None:
    """Every spec.autoscaling.intervalSeconds: scrape, decide, and scale the stable replicas.

    A daemon rather than a timer, because a timer's interval is fixed when it
    is declared, and each service sets its own. `body` is kept live by kopf,
    so a changed target or interval counts from the next tick. The
    recommendation history lives here, in memory: a restart starts a new
    one, which only delays scaling down by one window.
    """
    state, interval = ScalerState(), RETRY_DELAY_S
    while not stopped:
        try:
            service = _parse(memo, body)
            interval = service.autoscaling.interval_s
            state = await autoscale_once(memo, body, service, state)
        except ContractError:
            pass  # reconcile reports it; a fixed spec is read on the next tick
        except ApiException as err:  # the history is worth more than a restart's clean slate
            log.warning("%s: autoscaler tick failed: %s %s", body["metadata"]["name"],
                        err.status, err.reason)  # fmt: skip
        await stopped.wait(interval)


async def autoscale_once(
    memo: kopf.Memo, body: kopf.Body, service: ServiceSpec, state: ScalerState
) -> ScalerState:
    """One tick: the stable pods' metrics, the decision, the scale patch and status.metrics."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    pods = await asyncio.to_thread(memo.kube.pods, namespace, stable_selector(name))
    template = memo.config.metrics_url_template
    urls = {p["metadata"]["name"]: scrape_url(template, p) for p in pods if scrapable(p)}
    samples = await scrape(urls, memo.config.scrape_timeout_s)
    metrics = aggregate(samples, state.latency)
    scaling = service.autoscaling
    history = history_after(state.history, state.replicas, service.replicas)
    decision = desired_replicas(
        service.replicas, metrics.pods, ratios(metrics, scaling), ScalingPolicy.from_spec(scaling),
        history, time.monotonic(),
    )  # fmt: skip
    if decision.replicas != service.replicas:
        await asyncio.to_thread(memo.kube.scale, namespace, name, decision.replicas)
        message = f"{service.replicas} -> {decision.replicas} replicas: {decision.reason}"
        announce(body, "Scaled", message)
    status = {"metrics": metrics_status(metrics, decision)}
    await asyncio.to_thread(memo.kube.patch_status, namespace, name, status)
    latency = {pod: s.latency for pod, s in samples.items()}
    return ScalerState(decision.history, latency, decision.replicas)


def metrics_status(metrics: ServiceMetrics, decision: ScaleDecision) -> dict[str, Any]:
    """status.metrics; a metric no pod exported is removed (None in a merge patch)."""
    return {
        "queueDepth": metrics.queue_depth,
        "p99LatencyMs": metrics.p99_latency_ms,
        "gpuUtilization": metrics.gpu_utilization,
        "observedAt": _now(),
        "desiredReplicas": decision.replicas,
    }


def announce(owner: Any, reason: str, message: str) -> None:
    """An event on the InferenceService, and the same line in the operator's log."""
    meta = owner["metadata"]
    log.info("%s/%s: %s: %s", meta["namespace"], meta["name"], reason, message)
    kopf.info(owner, reason=reason, message=message)


def _spec_or_report(memo: kopf.Memo, body: kopf.Body) -> ServiceSpec:
    """The parsed spec; a bad one is reported in status and as an event, and never retried."""
    try:
        return _parse(memo, body)
    except ContractError as err:
        meta = body["metadata"]
        previous = (body.get("status") or {}).get("conditions") or []
        conditions = invalid_spec_conditions(str(err), previous, _now())
        memo.kube.patch_status(meta["namespace"], meta["name"], {"conditions": conditions})
        kopf.warn(body, reason="InvalidSpec", message=str(err))
        raise kopf.PermanentError(str(err)) from err


def model_storage(cfg: OperatorConfig) -> ModelStorage:
    """The operator's settings that rendering needs, as plain data."""
    return ModelStorage(cfg.hf_cache_claim, cfg.allow_model_download)


def _parse(memo: kopf.Memo, body: Any) -> ServiceSpec:
    """The spec, refused where this operator's settings cannot serve its weights."""
    cfg: OperatorConfig = memo.config
    service = parse_spec(
        dict(body["spec"]), cfg.engine_image, cfg.scheduler_name, cfg.allowed_priority_classes
    )
    check_storage(service, model_storage(cfg))
    return service


def _edited_by_others(memo: kopf.Memo, deployment: kopf.Body) -> bool:
    """A generation other than the one this operator's last apply produced.

    A Deployment this process has not applied yet is not judged: on.resume
    re-applies everything at start anyway.
    """
    key = (deployment["metadata"]["namespace"], deployment["metadata"]["name"])
    return key in memo.applied and memo.applied[key] != deployment["metadata"]["generation"]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
