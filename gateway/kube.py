"""The gateway's Kubernetes edge: the watches that feed the catalog, the scale subresource
it asks for a replica through, and the Secret of API keys.

Each watch is a list+watch loop (`infergrid.reflector`) per namespace and kind; every
change rebuilds the whole catalog (`build_catalog`, pure) from the objects held here and
publishes it to the event loop. A failing API call is logged and retried; the gateway keeps
routing by the last catalog it had.
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

from gateway.catalog import Catalog, build_catalog
from gateway.tenants import SECRET_KEY, KeyTable, parse_tenants
from infergrid.constants import CRD_GROUP, CRD_PLURAL, CRD_VERSION, LABEL_INFERENCESERVICE
from infergrid.errors import ContractError
from infergrid.reflector import Reflector, Source

log = logging.getLogger("infergrid.gateway.kube")

API_TIMEOUT_S = 10.0
Objects = dict[tuple[str, str], dict[str, Any]]


class CatalogFeed:
    """InferenceServices and their EndpointSlices, held and turned into catalogs."""

    def __init__(self, publish: Callable[[Catalog], None]) -> None:
        self._publish = publish
        self._lock = threading.Lock()
        self._kinds: dict[str, dict[str, Objects]] = {"services": {}, "slices": {}}
        self._listed: set[tuple[str, str]] = set()
        self._expected = 0

    def start(self, api: client.ApiClient, namespaces: tuple[str, ...], stop: threading.Event):
        custom, discovery = client.CustomObjectsApi(api), client.DiscoveryV1Api(api)
        sources = []
        for namespace in namespaces or ("",):
            if namespace:
                services = functools.partial(
                    custom.list_namespaced_custom_object,
                    CRD_GROUP, CRD_VERSION, namespace, CRD_PLURAL,
                )  # fmt: skip
                slices = functools.partial(discovery.list_namespaced_endpoint_slice, namespace)
            else:
                services = functools.partial(
                    custom.list_cluster_custom_object, CRD_GROUP, CRD_VERSION, CRD_PLURAL
                )
                slices = discovery.list_endpoint_slice_for_all_namespaces
            sources.append(self._source("services", namespace, services, {}))
            selector = {"label_selector": LABEL_INFERENCESERVICE}
            sources.append(self._source("slices", namespace, slices, selector))
        self._expected = len(sources)
        return Reflector().start(sources, stop)

    @property
    def synced(self) -> bool:
        with self._lock:
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
            self._kinds[kind][namespace] = {_key(o): o for o in items}
            self._listed.add(scope)
        self._rebuild()

    def _apply(self, kind: str, namespace: str, event: str, obj: dict[str, Any]) -> None:
        with self._lock:
            held = self._kinds[kind].setdefault(namespace, {})
            if event == "DELETED":
                held.pop(_key(obj), None)
            else:
                held[_key(obj)] = obj
        self._rebuild()

    def _rebuild(self) -> None:
        """Publishes the catalog of what is held, once every source has listed: before that a
        service could look pod-less only because its slices are not listed yet."""
        if not self.synced:
            return
        with self._lock:
            services = [o for group in self._kinds["services"].values() for o in group.values()]
            slices = [o for group in self._kinds["slices"].values() for o in group.values()]
        catalog = build_catalog(services, slices)
        for line in catalog.shadowed:
            log.warning("%s; it is not routed", line)
        self._publish(catalog)


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
