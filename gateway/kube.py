"""The gateway's Kubernetes edge: the watches that feed the catalog, the scale subresource
it asks for a replica through, and the Secret of API keys.

Each watch is a list+watch loop (`infergrid.reflector`) per namespace and kind
(InferenceServices, their EndpointSlices, their engine pods); every change rebuilds the whole
catalog (`build_catalog`, pure) from the objects held here and publishes it to the event loop.
Pods are held trimmed (`EnginePod`): the catalog needs only their names, labels and IPs to
tell a real endpoint from a forged one. A failing API call is logged and retried; the gateway
keeps routing by the last catalog it had.
"""

from __future__ import annotations

import base64
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gateway.catalog import Catalog, EnginePod, build_catalog
from gateway.tenants import SECRET_KEY, KeyTable, parse_tenants
from infergrid.constants import CRD_GROUP, CRD_PLURAL, CRD_VERSION, LABEL_INFERENCESERVICE
from infergrid.errors import ContractError
from infergrid.reflector import Reflector, Source

log = logging.getLogger("infergrid.gateway.kube")

API_TIMEOUT_S = 10.0
Objects = dict[tuple[str, str], Any]
# How each kind is held: pods trimmed to what the endpoint check reads, the rest whole.
HELD: dict[str, Callable[[dict[str, Any]], Any]] = {
    "services": lambda obj: obj,
    "slices": lambda obj: obj,
    "pods": EnginePod.of,
}


class CatalogFeed:
    """InferenceServices, their EndpointSlices and engine pods, held and turned into catalogs.

    One lock covers holding, building and publishing, so catalogs are published in the order
    of the events they hold: a catalog built before a pod's deletion never lands after it."""

    def __init__(self, publish: Callable[[Catalog], None]) -> None:
        self._publish = publish
        self._lock = threading.Lock()
        self._kinds: dict[str, dict[str, Objects]] = {kind: {} for kind in HELD}
        self._listed: set[tuple[str, str]] = set()
        self._expected = 0
        self._warned: set[tuple[str, str]] = set()  # slices refused, already logged

    def start(self, api: client.ApiClient, namespaces: tuple[str, ...], stop: threading.Event):
        custom, discovery = client.CustomObjectsApi(api), client.DiscoveryV1Api(api)
        core = client.CoreV1Api(api)
        selector = {"label_selector": LABEL_INFERENCESERVICE}  # the operator's objects only
        sources = []
        for namespace in namespaces or ("",):
            if namespace:
                services = functools.partial(
                    custom.list_namespaced_custom_object,
                    CRD_GROUP, CRD_VERSION, namespace, CRD_PLURAL,
                )  # fmt: skip
                slices = functools.partial(discovery.list_namespaced_endpoint_slice, namespace)
                pods = functools.partial(core.list_namespaced_pod, namespace)
            else:
                services = functools.partial(
                    custom.list_cluster_custom_object, CRD_GROUP, CRD_VERSION, CRD_PLURAL
                )
                slices = discovery.list_endpoint_slice_for_all_namespaces
                pods = core.list_pod_for_all_namespaces
            sources.append(self._source("services", namespace, services, {}))
            sources.append(self._source("slices", namespace, slices, selector))
            sources.append(self._source("pods", namespace, pods, selector))
        self._expected = len(sources)
        return Reflector().start(sources, stop)

    @property
    def synced(self) -> bool:
        """Every source has listed once: the gateway's readiness waits for it."""
        with self._lock:
            return self._all_listed()

    def _all_listed(self) -> bool:
        return len(self._listed) >= self._expected > 0

    def _source(self, kind: str, namespace: str, list_fn: Any, params: dict) -> Source:
        scope = (kind, namespace)
        return Source(
            kind=f"{kind} in {namespace or 'all namespaces'}",
            list_fn=list_fn,
            params=params,
            replace=lambda items, _mark: self._replace(scope, items),
            apply=lambda event, obj: self._apply(kind, namespace, event, obj),
        )

    def _replace(self, scope: tuple[str, str], items: list[dict[str, Any]]) -> None:
        kind, namespace = scope
        with self._lock:
            self._kinds[kind][namespace] = {_key(o): HELD[kind](o) for o in items}
            self._listed.add(scope)
            self._rebuild()

    def _apply(self, kind: str, namespace: str, event: str, obj: dict[str, Any]) -> None:
        with self._lock:
            held = self._kinds[kind].setdefault(namespace, {})
            if event == "DELETED":
                held.pop(_key(obj), None)
            else:
                held[_key(obj)] = HELD[kind](obj)
            self._rebuild()

    def _rebuild(self) -> None:
        """Publishes the catalog of what is held, once every source has listed: before that a
        service could look pod-less only because its slices are not listed yet. Under the
        lock."""
        if not self._all_listed():
            return
        held = {kind: [o for g in groups.values() for o in g.values()]
                for kind, groups in self._kinds.items()}  # fmt: skip
        catalog = build_catalog(held["services"], held["slices"], held["pods"])
        for line in catalog.shadowed:
            log.warning("%s; it is not routed", line)
        self._warn_refused(catalog)
        self._publish(catalog)

    def _warn_refused(self, catalog: Catalog) -> None:
        """Logs each refused slice once while it stays refused: a forged slice is news, and
        it is rebuilt into every catalog until the endpoint controller deletes it. Only the
        slices refused now are remembered, so the set stays as small as the slices held."""
        for namespace, name in catalog.refused.keys() - self._warned:
            log.warning("EndpointSlice %s/%s is not routed to: %s", namespace, name,
                        catalog.refused[namespace, name])  # fmt: skip
        self._warned = set(catalog.refused)


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace", ""), meta.get("name", ""))


def scale_up(api: client.ApiClient, namespace: str, name: str) -> bool:
    """Asks for one replica through the scale subresource, if the service still has none.
    True when this call set it. Blocking: the caller runs it in a thread."""
    custom = client.CustomObjectsApi(api)
    try:
        scale = custom.get_namespaced_custom_object_scale(
            CRD_GROUP, CRD_VERSION, namespace, CRD_PLURAL, name, _request_timeout=API_TIMEOUT_S
        )
        if (scale.get("spec") or {}).get("replicas", 0) > 0:
            return False
        version = scale["metadata"]["resourceVersion"]
        body = {"metadata": {"resourceVersion": version}, "spec": {"replicas": 1}}
        custom.patch_namespaced_custom_object_scale(
            CRD_GROUP, CRD_VERSION, namespace, CRD_PLURAL, name, body,
            _request_timeout=API_TIMEOUT_S,
        )  # fmt: skip
        return True
    except ApiException as err:
        if err.status == 409:  # someone scaled it in between: there is a replica coming
            return False
        log.warning("scaling %s/%s up from zero failed: %s %s", namespace, name, err.status,
                    err.reason)  # fmt: skip
        return False


class KeysSecretGone(ContractError):
    """The keys Secret does not exist (any more): every key it held is revoked."""


def read_keys(api: client.ApiClient, namespace: str, name: str) -> KeyTable:
    """The key table of the Secret; ContractError names what is wrong with it, and is a
    KeysSecretGone when the API server says the Secret is not there."""
    where = f"Secret {namespace}/{name}"
    try:
        secret = client.CoreV1Api(api).read_namespaced_secret(
            name, namespace, _request_timeout=API_TIMEOUT_S
        )
    except ApiException as err:
        if err.status == 404:
            raise KeysSecretGone(where, "not found: every API key is refused") from None
        raise ContractError(where, f"cannot be read: {err.status} {err.reason}") from None
    encoded = (secret.data or {}).get(SECRET_KEY)
    if encoded is None:
        raise ContractError(f"{where} data.{SECRET_KEY}", "is required")
    try:
        text = base64.b64decode(encoded).decode("utf-8")
    except (ValueError, UnicodeDecodeError) as err:
        raise ContractError(f"{where} data.{SECRET_KEY}", f"not UTF-8 text: {err}") from None
    return parse_tenants(text, f"{where} data.{SECRET_KEY}")
