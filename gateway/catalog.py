"""Which engine pods serve which model: InferenceServices and EndpointSlices, as plain data.

A request names a model; the InferenceService whose `spec.model.name` it is serves it, from
the ready endpoints of its Service's EndpointSlices, each one a pod of the stable track or
of the canary (told apart by `infergrid.tracks.track_of_pod`). Everything here is pure: the
watches hand the objects over as dicts and get a new `Catalog` back.

Two services may name the same model (say in two namespaces). Then the oldest one serves it
and the others are listed in `Catalog.shadowed`, so a newcomer can never take over a model
that clients already reach.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from infergrid.tracks import CANARY, STABLE, track_of_pod

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
ENDPOINT_CONTROLLER = "endpointslice-controller.k8s.io"
PORT_NAME = "http"  # the engine port's name in the operator's Service

Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True, slots=True)
class Backend:
    """One ready engine pod."""

    namespace: str
    pod: str
    url: str  # http://ip:port, no trailing slash
    track: str

    @property
    def key(self) -> Key:
        return (self.namespace, self.pod)


@dataclass(frozen=True, slots=True)
class Route:
    """One InferenceService as the gateway routes to it."""

    model: str
    namespace: str
    service: str
    canary_percent: int  # 0 without a canary
    replicas: int  # spec.replicas: 0 means no pod will come unless someone asks for one
    backends: tuple[Backend, ...] = ()

    @property
    def key(self) -> Key:
        return (self.namespace, self.service)

    def weights(self) -> dict[str, int]:
        """Each track's share in percent, over the tracks that have a ready pod now."""
        wanted = {STABLE: 100 - self.canary_percent, CANARY: self.canary_percent}
        live = {b.track for b in self.backends}
        kept = {t: w for t, w in wanted.items() if t in live and w > 0}
        if kept:
            return kept
        return {t: 1 for t in sorted(live)}  # a track at weight 0 serves only when it is all

    def on_track(self, track: str) -> tuple[Backend, ...]:
        return tuple(b for b in self.backends if b.track == track)


@dataclass(frozen=True, slots=True)
class Catalog:
    routes: Mapping[str, Route] = field(default_factory=dict)  # by model name
    shadowed: tuple[str, ...] = ()  # "namespace/name serves model m, already served by ..."

    def models(self) -> list[str]:
        return sorted(self.routes)

    def by_key(self, key: Key) -> Route | None:
        return next((r for r in self.routes.values() if r.key == key), None)


def build_catalog(services: Iterable[dict[str, Any]], slices: Iterable[dict[str, Any]]) -> Catalog:
    """The catalog of these InferenceServices, with the ready pods their slices list."""
    endpoints = _endpoints_by_service(slices)
    routes: dict[str, Route] = {}
    shadowed: list[str] = []
    for service in sorted(services, key=_age):
        route = _route(service, endpoints)
        if route is None:
            continue
        if (first := routes.get(route.model)) is not None:
            shadowed.append(
                f"{route.namespace}/{route.service} names model {route.model!r}, already "
                f"served by {first.namespace}/{first.service}"
            )
            continue
        routes[route.model] = route
    return Catalog(routes, tuple(shadowed))


def _age(service: dict[str, Any]) -> tuple[str, str, str]:
    meta = service.get("metadata") or {}
    return (meta.get("creationTimestamp") or "", meta.get("namespace") or "", meta.get("name", ""))


def _route(service: dict[str, Any], endpoints: Mapping[Key, list[Backend]]) -> Route | None:
    """None for an object the API server would not have let through (no model name)."""
    meta, spec = service.get("metadata") or {}, service.get("spec") or {}
    model = (spec.get("model") or {}).get("name")
    namespace, name = meta.get("namespace"), meta.get("name")
    if not (isinstance(model, str) and model and namespace and name):
        return None
    if meta.get("deletionTimestamp"):
        return None
    canary = spec.get("canary") or {}
    percent = canary.get("trafficPercent", 0) if canary else 0
    replicas = spec.get("replicas", 1)
    return Route(
        model=model,
        namespace=namespace,
        service=name,
        canary_percent=percent if isinstance(percent, int) else 0,
        replicas=replicas if isinstance(replicas, int) else 1,
        backends=tuple(sorted(endpoints.get((namespace, name), []), key=lambda b: b.pod)),
    )


def _endpoints_by_service(slices: Iterable[dict[str, Any]]) -> dict[Key, list[Backend]]:
    found: dict[Key, dict[str, Backend]] = {}
    for eps in slices:
        meta = eps.get("metadata") or {}
        service = _controllers_service(meta)
        port = _port(eps.get("ports") or [])
        if not service or port is None:
            continue
        namespace = meta.get("namespace", "")
        seen = found.setdefault((namespace, service), {})
        for endpoint in eps.get("endpoints") or []:
            backend = _backend(namespace, service, endpoint, port)
            if backend is not None:
                seen[backend.pod] = backend
    return {key: list(pods.values()) for key, pods in found.items()}


def _controllers_service(meta: dict[str, Any]) -> str | None:
    """The Service whose slice this is, if Kubernetes' endpoint controller made it for that
    Service (its label, and the Service as its controlling owner); None for a slice someone
    wrote by hand, whose addresses could send a model's callers anywhere. The controller
    rewrites or deletes a slice that carries its label but does not match the Service."""
    labels = meta.get("labels") or {}
    service = labels.get(SERVICE_NAME_LABEL)
    if not service or labels.get(MANAGED_BY_LABEL) != ENDPOINT_CONTROLLER:
        return None
    owners = meta.get("ownerReferences") or []
    owned = any(o.get("kind") == "Service" and o.get("name") == service and o.get("controller")
                for o in owners if isinstance(o, dict))  # fmt: skip
    return service if owned else None


def _port(ports: list[dict[str, Any]]) -> int | None:
    named = [p.get("port") for p in ports if p.get("name") == PORT_NAME]
    return next((p for p in named if isinstance(p, int)), None)


def _backend(namespace: str, service: str, endpoint: dict[str, Any], port: int) -> Backend | None:
    """A ready endpoint of a pod of one of the service's tracks, else None. `ready` unset
    counts as ready, as the EndpointSlice API says; a terminating pod is never ready."""
    conditions = endpoint.get("conditions") or {}
    if conditions.get("ready") is False or conditions.get("terminating") is True:
        return None
    ref = endpoint.get("targetRef") or {}
    addresses = endpoint.get("addresses") or []
    if ref.get("kind") != "Pod" or not addresses:
        return None
    track = track_of_pod(service, ref.get("name", ""))
    if track is None:
        return None
    return Backend(namespace, ref["name"], _url(addresses[0], port), track)


def _url(address: str, port: int) -> str:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return f"http://{address}:{port}"
    host = f"[{ip}]" if ip.version == 6 else str(ip)
    return f"http://{host}:{port}"
