"""kopf handlers: InferenceService in, Deployment + Service + ConfigMap + PDB out, and the
engines' fences where the settings ask for them (a NetworkPolicy, a token Secret).

Level-based throughout: every handler reads the current state and re-applies
the rendered children, so it converges from anything (a crash mid-reconcile,
a deleted or edited Deployment) and repeating it changes nothing. There is no
delete handler: the children carry owner references, and the garbage
collector removes them with their InferenceService. Only objects this service
controls are written (ownership.py); old engine ConfigMaps go once no pod can
start from them (configmap_gc.py).

The memo carries `config` (OperatorConfig), `kube` (Kube), `refreshes` (one
Refresh per service), `applied` (the Deployment generations this operator
last wrote, to tell its own writes from someone else's edits) and `refused`
(the services whose children's names are taken, whose status says so).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
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
from .claims import template_name
from .conditions import (
    compute_status,
    observe_deployment,
    refused_conditions,
    status_patch,
    transitions,
)
from .config import OperatorConfig, scans_namespaces
from .configmap_gc import (
    claim_templates_in_use,
    collectable,
    configmaps_in_use,
    rollout_settled,
)
from .engine_access import EngineAccess
from .gpu_faults import pod_to_replace
from .kube import Kube
from .metrics_scrape import (
    Buckets,
    MetricsUnreadable,
    ServiceMetrics,
    aggregate,
    gateway_pending,
    scrapable,
    scrape,
    scrape_url,
)
from .ownership import conflict_message, conflicts, controlled_by
from .render import (
    LABEL_SERVICE,
    ModelStorage,
    check_storage,
    configmap_name,
    render_children,
    stable_selector,
    stale_deployments,
    track_replicas,
)
from .spec import ServiceSpec, parse_spec

log = logging.getLogger("infergrid.operator")
RESOURCE = (CRD_GROUP, CRD_VERSION, CRD_PLURAL)
RETRY_DELAY_S = 5
FAULT_CHECK_INTERVAL_S = 5  # how often each service's pods are checked for unhealthy GPUs


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
    memo.setdefault("refused", set())
    settings.execution.max_workers = memo.config.max_workers
    # kopf's scan also watches CRDs; serving named namespaces, it needs neither (scans_namespaces).
    named = memo.config.namespaces and not scans_namespaces(memo.config.namespaces)
    settings.scanning.disabled = bool(named)


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
        _apply_or_report(memo, body, service)
        collect_unused(memo, namespace, name)
        refresh_status(memo, namespace, name)
    except ApiException as err:
        raise kopf.TemporaryError(f"API: {err.status} {err.reason}", delay=RETRY_DELAY_S) from err
    patch.status["observedGeneration"] = meta["generation"]


@kopf.on.event("apps/v1", "deployments", labels={LABEL_SERVICE: kopf.PRESENT})
def deployment_event(
    type: str | None, body: kopf.Body, namespace: str, labels: kopf.Labels, memo: kopf.Memo,
    **_: Any,
) -> None:  # fmt: skip
    """Restores a Deployment that was deleted or edited, and reports rollout progress.

    A settled rollout is when the old ReplicaSets stop making pods: their ConfigMaps
    may go then.
    """
    name = labels[LABEL_SERVICE]
    if type == "DELETED" or _edited_by_others(memo, body):
        restore(memo, namespace, name, body, deleted=type == "DELETED")
    elif rollout_settled(body):
        collect_unused(memo, namespace, name)
    refresh_status(memo, namespace, name)


@kopf.on.event("v1", "pods", labels={LABEL_SERVICE: kopf.PRESENT})
def pod_event(
    type: str | None, namespace: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    """A pod was scheduled, failed to be, became ready or went: the status follows.

    A pod gone may have been the last one mounting an old ConfigMap.
    """
    if type == "DELETED":
        collect_unused(memo, namespace, labels[LABEL_SERVICE])
    refresh_status(memo, namespace, labels[LABEL_SERVICE])


@kopf.timer(*RESOURCE, interval=FAULT_CHECK_INTERVAL_S)
def replace_faulted_pod(
    body: kopf.Body, name: str, namespace: str, memo: kopf.Memo, **_: Any
) -> None:
    """Deletes one pod whose GPU has been unhealthy past the grace period (gpu_faults.py);
    its Deployment makes a new one, which the extender places on a healthy GPU."""
    pods = memo.kube.pods(namespace, f"{LABEL_SERVICE}={name}")
    chosen = pod_to_replace(pods, datetime.now(UTC), memo.config.gpu_fault_grace_s)
    if chosen is None:
        return
    try:
        deleted = memo.kube.delete("Pod", namespace, chosen.name, chosen.uid)
    except ApiException as err:
        raise kopf.TemporaryError(f"API: {err.status} {err.reason}", delay=RETRY_DELAY_S) from err
    if deleted:
        log.warning("%s/%s: replacing %s", namespace, name, chosen.message)
        kopf.warn(body, reason="GPUFaultReplaced", message=f"replacing {chosen.message}")


class OwnershipConflict(Exception):
    """Children's names are taken by objects this service does not control; nothing was
    written."""


def apply_children(memo: kopf.Memo, owner: dict[str, Any], service: ServiceSpec) -> dict[str, int]:
    """Server-side apply of every child, owned by the InferenceService; stale ones deleted.

    Every child's name is checked before anything is written: one taken by an object
    this service does not control raises OwnershipConflict, naming them all. Returns
    each Deployment's generation after the apply.
    """
    meta = owner["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    cfg = memo.config
    children = render_children(service, name, namespace, model_storage(cfg), engine_access(cfg))
    kopf.adopt(children, owner=owner)
    existing = {_key(c): memo.kube.read(c["kind"], namespace, c["metadata"]["name"])
                for c in children}  # fmt: skip
    taken = conflicts(children, existing, uid)
    if taken:
        raise OwnershipConflict(conflict_message(taken))
    generations = {}
    for child in children:
        applied = memo.kube.apply(child)
        if child["kind"] == "Deployment":
            generations[child["metadata"]["name"]] = applied["metadata"]["generation"]
            memo.applied[(namespace, child["metadata"]["name"])] = applied["metadata"]["generation"]
    for stale in stale_deployments(service, name):
        if delete_owned(memo, namespace, "Deployment", stale, uid):
            announce(owner, "Deleted", f"Deployment {stale}: no canary in spec")
    return generations


def delete_owned(memo: kopf.Memo, namespace: str, kind: str, name: str, uid: str) -> bool:
    """Deletes the object of that name only if the service `uid` controls it, and only the
    one read (a UID precondition); a `web-canary` someone else made stays."""
    found = memo.kube.read(kind, namespace, name)
    if found is None or not controlled_by(found, uid):
        return False
    return memo.kube.delete(kind, namespace, name, found["metadata"]["uid"])


def collect_unused(memo: kopf.Memo, namespace: str, name: str) -> None:
    """Deletes the service's engine ConfigMaps and ResourceClaimTemplates that no pod runs
    with or may start with.

    They are listed before the service is read, so each one listed was made for the spec
    read or an older one, and the spec read's own are kept.
    """
    configmaps = memo.kube.configmaps(namespace, name)
    templates = memo.kube.claim_templates(namespace, name)
    owner = memo.kube.service(namespace, name)
    if not (configmaps or templates) or owner is None or owner["metadata"].get("deletionTimestamp"):
        return
    try:
        service = _parse(memo, owner)
    except ContractError:
        return  # reconcile has already reported it
    uid = owner["metadata"]["uid"]
    workloads = (
        list(memo.kube.deployments(namespace, name).values()),
        memo.kube.replicasets(namespace, name),
        memo.kube.pods(namespace, f"{LABEL_SERVICE}={name}"),
    )
    keep = {configmap_name(service, name, t) for t in track_replicas(service)}
    keep |= configmaps_in_use(*workloads)
    _delete_unused(memo, owner, "ConfigMap", collectable(configmaps, uid, keep))
    keep = {template_name(name, c) for c in service.resources.claims}
    keep |= claim_templates_in_use(*workloads)
    _delete_unused(memo, owner, "ResourceClaimTemplate", collectable(templates, uid, keep))


def _delete_unused(
    memo: kopf.Memo, owner: dict[str, Any], kind: str, unused: list[tuple[str, str]]
) -> None:
    namespace, name = owner["metadata"]["namespace"], owner["metadata"]["name"]
    for child, uid in unused:
        if memo.kube.delete(kind, namespace, child, uid):
            log.info("%s/%s: deleted %s %s: no pod uses it", namespace, name, kind, child)


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
        generations = apply_children(memo, owner, service)
    except (ContractError, OwnershipConflict):
        return  # reconcile has already reported it
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
    if (namespace, name) in memo.refused:
        return  # its status names the objects in the way, until a reconcile succeeds
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
    replica count it last decided (to tell a hand-set count, or the gateway's, from its own)."""

    history: History = ()
    latency: dict[str, Buckets] = field(default_factory=dict)
    replicas: int | None = None
    ignored: frozenset[str] = frozenset()  # pods whose /metrics was ignored last tick
    gateway_failing: bool = False  # the gateway's /metrics was unreadable last tick


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
    """One tick: the stable pods' metrics and the gateway's pending requests, the decision,
    the scale patch and status.metrics."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    pods = await asyncio.to_thread(memo.kube.pods, namespace, stable_selector(name))
    template, runtime = memo.config.metrics_url_template, service.runtime
    urls = {
        p["metadata"]["name"]: scrape_url(template, p, runtime.port) for p in pods if scrapable(p)
    }
    scraped, (pending, gateway_failing) = await asyncio.gather(
        scrape(urls, memo.config.scrape_timeout_s, runtime.metrics),
        read_pending(memo.config, namespace, name, state.gateway_failing),
    )
    warn_ignored_metrics(body, scraped.ignored, state.ignored)
    metrics = aggregate(scraped.samples, state.latency)
    scaling = service.autoscaling
    history = history_after(state.history, state.replicas, service.replicas)
    decision = desired_replicas(
        service.replicas, metrics.pods, ratios(metrics, scaling), ScalingPolicy.from_spec(scaling),
        history, time.monotonic(), pending=pending or 0,
    )  # fmt: skip
    if decision.replicas != service.replicas:
        await asyncio.to_thread(memo.kube.scale, namespace, name, decision.replicas)
        message = f"{service.replicas} -> {decision.replicas} replicas: {decision.reason}"
        announce(body, "Scaled", message)
    status = {"metrics": metrics_status(metrics, decision, pending)}
    await asyncio.to_thread(memo.kube.patch_status, namespace, name, status)
    latency = {pod: s.latency for pod, s in scraped.samples.items()}
    return ScalerState(decision.history, latency, decision.replicas, frozenset(scraped.ignored),
                       gateway_failing)  # fmt: skip


async def read_pending(
    cfg: OperatorConfig, namespace: str, name: str, failing: bool
) -> tuple[float | None, bool]:
    """The requests the gateway holds for the service, and whether reading them failed.

    None without a gateway, or when its /metrics cannot be read: the rule counts that as no
    pending request, and the tick goes on. A failure is logged once per streak of failures
    (`failing` says whether the last tick's read failed), not on every tick.
    """
    if not cfg.gateway_metrics_url:
        return None, False
    try:
        pending = await gateway_pending(
            cfg.gateway_metrics_url, namespace, name, cfg.scrape_timeout_s
        )
    except MetricsUnreadable as err:
        if not failing:
            log.warning("%s/%s: gateway metrics %s unreadable (%s); no pending requests counted "
                        "until they can be read", namespace, name, cfg.gateway_metrics_url,
                        err)  # fmt: skip
        return None, True
    if failing:
        log.info("%s/%s: gateway metrics readable again", namespace, name)
    return pending, False


def warn_ignored_metrics(owner: Any, ignored: Mapping[str, str], known: frozenset[str]) -> None:
    """A warning event on the service for each pod whose /metrics is newly ignored, naming the
    pod and why: the engine image is the service owner's, who cannot read the operator's log.
    Once while a pod stays ignored, so a tick every few seconds does not flood the events."""
    for pod in sorted(ignored.keys() - known):
        message = f"pod {pod}: {ignored[pod]}; the autoscaler ignores its metrics"
        kopf.warn(owner, reason="MetricsIgnored", message=message)


def metrics_status(
    metrics: ServiceMetrics, decision: ScaleDecision, pending: float | None
) -> dict[str, Any]:
    """status.metrics; a metric no pod exported, and the pending requests where no gateway
    was read, are removed (None in a merge patch)."""
    return {
        "queueDepth": metrics.queue_depth,
        "p99LatencyMs": metrics.p99_latency_ms,
        "gpuUtilization": metrics.gpu_utilization,
        "pendingRequests": pending,
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
        _report_refusal(memo, body, "InvalidSpec", str(err))
        raise kopf.PermanentError(str(err)) from err


def _apply_or_report(memo: kopf.Memo, body: kopf.Body, service: ServiceSpec) -> None:
    """apply_children; children's names taken by others are reported in status and as an
    event, and not retried until the spec changes (or the operator restarts)."""
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    try:
        apply_children(memo, body, service)
    except OwnershipConflict as err:
        memo.refused.add(key)
        _report_refusal(memo, body, "OwnershipConflict", str(err))
        raise kopf.PermanentError(str(err)) from err
    memo.refused.discard(key)


def _report_refusal(memo: kopf.Memo, body: kopf.Body, reason: str, message: str) -> None:
    """Not Ready and Degraded with `reason`, and a warning event with the same message."""
    meta = body["metadata"]
    previous = (body.get("status") or {}).get("conditions") or []
    conditions = refused_conditions(reason, message, previous, _now())
    memo.kube.patch_status(meta["namespace"], meta["name"], {"conditions": conditions})
    kopf.warn(body, reason=reason, message=message)


def model_storage(cfg: OperatorConfig) -> ModelStorage:
    """The operator's settings that rendering needs, as plain data."""
    return ModelStorage(cfg.hf_cache_claim, cfg.allow_model_download)


def engine_access(cfg: OperatorConfig) -> EngineAccess:
    """The operator's settings that fence engines (engine_access.py), as plain data."""
    return EngineAccess(cfg.engine_network_policy, cfg.engine_callers,
                        cfg.engine_ingress_cidrs, cfg.engine_token_key)  # fmt: skip


def _parse(memo: kopf.Memo, body: Any) -> ServiceSpec:
    """The spec, refused where this operator's settings cannot serve its weights."""
    cfg: OperatorConfig = memo.config
    service = parse_spec(
        dict(body["spec"]),
        cfg.engine_image,
        cfg.scheduler_name,
        cfg.allowed_priority_classes,
        name=body["metadata"]["name"],
        runtime_images=dict(cfg.runtime_images),
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


def _key(child: dict[str, Any]) -> tuple[str, str]:
    return child["kind"], child["metadata"]["name"]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
