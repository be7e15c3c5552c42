"""Which engine pods serve which model: InferenceServices, EndpointSlices and engine pods,
as plain data.

A request names a model; the InferenceService whose `spec.model.name` it is serves it, from
the ready endpoints of its Service's EndpointSlices, each one a pod of the stable track or
of the canary (told apart by `infergrid.tracks.track_of_pod`). Everything here is pure: the
watches hand the objects over as dicts (pods trimmed to an `EnginePod`) and get a new
`Catalog` back.

Nothing in an EndpointSlice proves who wrote it: whoever may create slices in a namespace can
copy the endpoint controller's labels, its managed-by label and the Service as controlling
owner. So an endpoint is called only at the address of a live pod of that namespace carrying
the service's label (`endpoint_pod`): a forged slice can name at most the tenant's own engine
pods, never another address.

Model names are chosen by tenants, so they are not global: a route is keyed by its namespace
and its model name, and two namespaces may serve one name side by side (which name a caller
reaches is `model_names.py`'s to decide, per caller). Two services of one namespace naming one
model: the oldest serves it, and the others are listed in `Catalog.shadowed` and logged, so a
newcomer cannot take over a model its own namespace's clients already reach. A tenant can
only shadow itself.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from infergrid.constants import LABEL_INFERENCESERVICE
from infergrid.engine_metrics import INFERGRID_METRICS, MetricNames
from infergrid.errors import ContractError
from infergrid.runtimes import RUNTIMES, Runtime, read_runtime
from infergrid.serving_config import BY_ATTR, DEFAULT_PORT
from infergrid.tracks import CANARY, STABLE, track_of_pod

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
ENDPOINT_CONTROLLER = "endpointslice-controller.k8s.io"
PORT_NAME = "http"  # the engine port's name in the operator's Service

Key = tuple[str, str]  # (namespace, name)
ModelKey = tuple[str, str]  # (namespace, model name)


@dataclass(frozen=True, slots=True)
class Backend:
    """One ready engine pod."""

    namespace: str
    pod: str
    url: str  # http://ip:port, no trailing slash
    track: str
    metrics: MetricNames = INFERGRID_METRICS  # its runtime's series, as its service says

    @property
    def key(self) -> Key:
        return (self.namespace, self.pod)


@dataclass(frozen=True, slots=True)
class EnginePod:
    """What the endpoint check needs of a pod, and no more: the gateway holds one per engine
    pod it serves, so a full pod object (spec, env, managed fields) would cost it memory."""

    namespace: str
    name: str
    service: str | None  # its LABEL_INFERENCESERVICE, the operator Service's whole selector
    ips: frozenset[str]  # status.podIP and status.podIPs, each in ipaddress' canonical form
    terminating: bool  # metadata.deletionTimestamp is set

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    @classmethod
    def of(cls, pod: dict[str, Any]) -> EnginePod:
        """The trimmed record of a pod as the API server sends it."""
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        listed = [status.get("podIP"), *((p or {}).get("ip") for p in status.get("podIPs") or [])]
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            service=(meta.get("labels") or {}).get(LABEL_INFERENCESERVICE),
            ips=frozenset(ip for ip in map(_canonical_ip, listed) if ip is not None),
            terminating=bool(meta.get("deletionTimestamp")),
        )


@dataclass(frozen=True, slots=True)
class Route:
    """One InferenceService as the gateway routes to it."""

    model: str
    namespace: str
    service: str
    canary_percent: int  # 0 without a canary
    replicas: int  # spec.replicas: 0 means no pod will come unless someone asks for one
    backends: tuple[Backend, ...] = ()
    context_tokens: int | None = None  # spec.engine.maxModelLen: prompt plus answer, at most

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
    routes: Mapping[ModelKey, Route] = field(default_factory=dict)
    shadowed: tuple[str, ...] = ()  # "namespace/name serves model m, already served by ..."
    refused: Mapping[Key, str] = field(default_factory=dict)  # slice -> why an endpoint is not
    by_model: Mapping[str, tuple[Route, ...]] = field(init=False)  # a name's, by namespace
    by_service: Mapping[Key, Route] = field(init=False)

    def __post_init__(self) -> None:
        by_model: dict[str, list[Route]] = {}
        for route in sorted(self.routes.values(), key=lambda r: r.namespace):
            by_model.setdefault(route.model, []).append(route)
        object.__setattr__(self, "by_model", {m: tuple(rs) for m, rs in by_model.items()})
        object.__setattr__(self, "by_service", {r.key: r for r in self.routes.values()})

    @classmethod
    def of(cls, *routes: Route) -> Catalog:
        """The catalog of routes built by hand (tests, benchmarks), one per model and
        namespace."""
        return cls({(r.namespace, r.model): r for r in routes})


def build_catalog(
    services: Iterable[dict[str, Any]],
    slices: Iterable[dict[str, Any]],
    pods: Iterable[EnginePod],
) -> Catalog:
    """The catalog of these InferenceServices, with the ready pods their slices list: those
    of `pods` only (the engine pods of the namespaces served). Slices naming anything else
    are in `Catalog.refused`, with the first reason."""
    services = list(services)
    ports = {_service_key(s): runtime_of(s.get("spec") or {}).port for s in services}
    endpoints, refused = _endpoints_by_service(slices, {p.key: p for p in pods}, ports)
    routes: dict[ModelKey, Route] = {}
    shadowed: list[str] = []
    for service in sorted(services, key=_age):
        route = _route(service, endpoints)
        if route is None:
            continue
        if (first := routes.get((route.namespace, route.model))) is not None:
            shadowed.append(
                f"{route.namespace}/{route.service} names model {route.model!r}, already "
                f"served by {first.namespace}/{first.service}"
            )
            continue
        routes[(route.namespace, route.model)] = route
    return Catalog(routes, tuple(shadowed), refused)


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
    context = (spec.get("engine") or {}).get("maxModelLen", BY_ATTR["max_model_len"].default)
    names = runtime_of(spec).metrics
    backends = [replace(b, metrics=names) for b in endpoints.get((namespace, name), [])]
    return Route(
        model=model,
        namespace=namespace,
        service=name,
        canary_percent=percent if isinstance(percent, int) else 0,
        replicas=replicas if isinstance(replicas, int) else 1,
        backends=tuple(sorted(backends, key=lambda b: b.pod)),
        context_tokens=context if isinstance(context, int) else None,
    )


def runtime_of(spec: Mapping[str, Any]) -> Runtime:
    """The service's runtime: its engine port and the series it reports its load in. A spec
    the operator would refuse (an unknown runtime, a bad custom one) is read as the bundled
    engine's: its pods, on no engine port of that runtime, route nothing."""
    try:
        return read_runtime(spec)
    except ContractError:
        return RUNTIMES["infergrid"]


def _service_key(service: Mapping[str, Any]) -> Key:
    meta = service.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


def _endpoints_by_service(
    slices: Iterable[dict[str, Any]], pods: Mapping[Key, EnginePod], ports: Mapping[Key, int]
) -> tuple[dict[Key, list[Backend]], dict[Key, str]]:
    """`ports`: each InferenceService's engine port, its runtime's."""
    found: dict[Key, dict[str, Backend]] = {}
    refused: dict[Key, str] = {}
    for eps in slices:
        meta = eps.get("metadata") or {}
        service = _controllers_service(meta)
        namespace = meta.get("namespace", "")
        expected = ports.get((namespace, service or ""), DEFAULT_PORT)
        port = _port(eps.get("ports") or [], expected)
        if not service or port is None:
            continue
        seen = found.setdefault((namespace, service), {})
        for endpoint in eps.get("endpoints") or []:
            if not _serving(endpoint):
                continue
            pod = endpoint_pod(namespace, service, endpoint, pods)
            if isinstance(pod, str):
                refused.setdefault((namespace, meta.get("name", "")), pod)
            elif backend := _backend(pod, service, endpoint["addresses"][0], port):
                seen[backend.pod] = backend
    return {key: list(by_pod.values()) for key, by_pod in found.items()}, refused


def _controllers_service(meta: dict[str, Any]) -> str | None:
    """The Service whose slice this is, if it reads as Kubernetes' endpoint controller made
    it for that Service (its label, and the Service as its controlling owner); None for a
    slice that does not even claim so. Every one of these fields can be forged (the controller
    deletes such a slice only a second or so later), so this only sorts slices out:
    `endpoint_pod` is the check a forgery cannot pass."""
    labels = meta.get("labels") or {}
    service = labels.get(SERVICE_NAME_LABEL)
    if not service or labels.get(MANAGED_BY_LABEL) != ENDPOINT_CONTROLLER:
        return None
    owners = meta.get("ownerReferences") or []
    owned = any(o.get("kind") == "Service" and o.get("name") == service and o.get("controller")
                for o in owners if isinstance(o, dict))  # fmt: skip
    return service if owned else None


def _port(ports: list[dict[str, Any]], expected: int) -> int | None:
    """The slice's engine port: the one named `http`, and only if it is the port the operator
    gives the service's engine pods (its runtime's, `expected`). A slice's ports are as
    forgeable as the rest of it, and another port of a pod (a hostNetwork pod's is the
    node's) is no engine."""
    named = [p.get("port") for p in ports if p.get("name") == PORT_NAME]
    return expected if expected in named else None


def _serving(endpoint: dict[str, Any]) -> bool:
    """Whether the slice says the endpoint takes requests: `ready` unset counts as ready, as
    the EndpointSlice API says; a terminating pod is never ready."""
    conditions = endpoint.get("conditions") or {}
    return conditions.get("ready") is not False and conditions.get("terminating") is not True


def endpoint_pod(
    namespace: str, service: str, endpoint: dict[str, Any], pods: Mapping[Key, EnginePod]
) -> EnginePod | str:
    """The engine pod of `service` this endpoint of a slice in `namespace` is, or why it is
    none. Each condition closes a way a hand-written slice (its writer chooses every field)
    could point the gateway elsewhere:

    - the target is a Pod of the slice's own namespace: a slice cannot lend a route another
      namespace's pod, a node, or anything the gateway does not watch;
    - that pod is among the engine pods watched: a made-up name has no address to check;
    - it carries the service's label, the operator Service's whole selector: it is a pod the
      endpoint controller itself would list, so a slice reaches only its own service's pods;
    - the endpoint's address is one of that pod's IPs, which only the kubelet writes: any
      other address (another tenant's engine, a metadata service, a hostname) is never called.
    """
    ref = endpoint.get("targetRef") or {}
    name, addresses = ref.get("name", ""), endpoint.get("addresses") or []
    if ref.get("kind") != "Pod":
        return f"an endpoint targets {ref.get('kind') or 'nothing'}, not a Pod"
    if ref.get("namespace", namespace) != namespace:
        return f"endpoint {name} targets a pod of namespace {ref.get('namespace')}"
    pod = pods.get((namespace, name))
    if pod is None:
        return f"endpoint {name} targets no engine pod of {namespace}"
    if pod.service != service:
        return f"pod {name} does not carry {LABEL_INFERENCESERVICE}={service}"
    if not addresses or _canonical_ip(addresses[0]) not in pod.ips:
        return f"endpoint {name} has address {addresses[:1]}, not the pod's IP"
    return pod


def _backend(pod: EnginePod, service: str, address: str, port: int) -> Backend | None:
    """The pod as a backend of one of its service's tracks. None for a pod that neither of the
    service's Deployments made, and for a terminating pod: its address is about to be freed
    for another pod. (Not reported: the pod watch and the slice watch race at every rollout,
    so a real slice may still call a terminating pod ready for a moment.)"""
    track = track_of_pod(service, pod.name)
    if track is None or pod.terminating:
        return None
    return Backend(pod.namespace, pod.name, _url(address, port), track)


def _canonical_ip(address: Any) -> str | None:
    """The address as ipaddress writes it (one spelling per IPv6 address), None if not an IP."""
    if not isinstance(address, str):
        return None
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None


def _url(address: str, port: int) -> str:
    ip = ipaddress.ip_address(address)
    host = f"[{ip}]" if ip.version == 6 else str(ip)
    return f"http://{host}:{port}"
