"""Who may call an InferenceService's engines: its NetworkPolicy and its engine token.

Engines answer whoever reaches their port, so the gateway's keys, namespace rules and
buckets mean nothing to a pod that calls an engine directly. Two fences, both rendered
here as plain manifests:

- A NetworkPolicy per service admits the engine port (by its name) only from the callers
  the operator's settings name (the gateway's pods and the operator's own, which scrapes
  /metrics; each a namespace and pod labels), from CIDRs (a part running outside the pod
  network, as the operator does in the e2e tests), and, where the spec's
  `network.allowSameNamespace` says so, from the service's own namespace. No peer at all
  admits nothing. Kubelet probes are not subject to NetworkPolicy.
- Where the network plugin does not enforce NetworkPolicy, the engine token: a Secret in
  the service's namespace holding HMAC(key, "namespace/name") (infergrid/engine_token.py),
  mounted into the engine pods, which then answer /v1/* only with it; the gateway derives
  the same token for the service it forwards to.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass, field
from typing import Any, Final

from infergrid.codec import expect, join
from infergrid.constants import LABEL_INFERENCESERVICE
from infergrid.engine_token import SECRET_KEY, TOKEN_FILE_ENV, derive
from infergrid.errors import ContractError

NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"  # set by the API server
ENGINE_PORT_NAME: Final = "http"
TOKEN_VOLUME: Final = "engine-token"
TOKEN_DIR: Final = "/var/run/infergrid/engine-token"
TOKEN_SUFFIX: Final = "-engine-token"
TOKEN_HASH_ANNOTATION: Final = "infergrid.io/engine-token-sha256"
TOKEN_HASH_LENGTH: Final = 16
_LABEL_KEY: Final = re.compile(
    r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)


@dataclass(frozen=True, slots=True)
class Caller:
    """The pods with these labels in this namespace: a part that calls engines."""

    namespace: str
    pod_labels: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class EngineAccess:
    """The operator's settings that fence engines, as plain data for rendering."""

    network_policy: bool = False
    callers: tuple[Caller, ...] = ()
    cidrs: tuple[str, ...] = ()
    token_key: bytes = field(default=b"", repr=False)  # empty: engines take no token


NO_FENCES: Final = EngineAccess()  # engines open to any pod: the bare operator's default


def token_secret_name(name: str) -> str:
    return name + TOKEN_SUFFIX


def render_network_policy(
    name: str, namespace: str, access: EngineAccess, same_namespace: bool, labels: dict[str, str]
) -> dict[str, Any]:
    """Ingress to the engine port of both tracks' pods, from the allowed peers only."""
    peers = [_caller_peer(c) for c in access.callers]
    peers += [{"ipBlock": {"cidr": cidr}} for cidr in access.cidrs]
    if same_namespace:
        peers.append({"podSelector": {}})
    # A rule without `from` admits every source: with no peer, no rule at all.
    ingress = [{"from": peers, "ports": [{"port": ENGINE_PORT_NAME, "protocol": "TCP"}]}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "podSelector": {"matchLabels": {LABEL_INFERENCESERVICE: name}},
            "policyTypes": ["Ingress"],
            "ingress": ingress if peers else [],
        },
    }


def render_token_secret(
    name: str, namespace: str, key: bytes, labels: dict[str, str]
) -> dict[str, Any]:
    """The service's engine token, readable in its namespace as any Secret there is."""
    token = derive(key, namespace, name)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": token_secret_name(name), "namespace": namespace, "labels": labels},
        "type": "Opaque",
        "data": {SECRET_KEY: base64.b64encode(token.encode()).decode()},
    }


def token_volume(name: str) -> dict[str, Any]:
    source = {"secretName": token_secret_name(name), "defaultMode": 0o444}
    return {"name": TOKEN_VOLUME, "secret": source}


def token_mount() -> dict[str, Any]:
    return {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True}


def token_env() -> dict[str, str]:
    return {"name": TOKEN_FILE_ENV, "value": f"{TOKEN_DIR}/{SECRET_KEY}"}


def token_annotation(name: str, namespace: str, key: bytes) -> dict[str, str]:
    """A digest of the token on the pod template: the engine reads its token once, at
    start, so a new key rolls the pods out. A truncated SHA-256 of 256 random bits tells
    nothing of the token."""
    digest = hashlib.sha256(derive(key, namespace, name).encode()).hexdigest()
    return {TOKEN_HASH_ANNOTATION: digest[:TOKEN_HASH_LENGTH]}


def _caller_peer(caller: Caller) -> dict[str, Any]:
    return {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: caller.namespace}},
        "podSelector": {"matchLabels": dict(caller.pod_labels)},
    }


# Settings readers (config.py): refusals name the setting and the item.


def callers(doc: dict[str, Any], key: str) -> tuple[Caller, ...]:
    """A list of {namespace, podLabels}; on the command line the same list as JSON."""
    value = doc[key]
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as err:
            raise ContractError(key, f"expected a JSON list: {err}") from None
    items = expect(value, list, key)
    return tuple(_caller(item, f"{key}[{i}]") for i, item in enumerate(items))


def _caller(item: object, path: str) -> Caller:
    doc = expect(item, dict, path)
    unknown = sorted(set(doc) - {"namespace", "podLabels"})
    if unknown:
        raise ContractError(join(path, unknown[0]), "is not namespace or podLabels")
    namespace = expect(doc.get("namespace"), str, join(path, "namespace"))
    labels = expect(doc.get("podLabels"), dict, join(path, "podLabels"))
    if not labels:
        raise ContractError(join(path, "podLabels"), "must name at least one label")
    return Caller(namespace, tuple(sorted(_label(k, v, path) for k, v in labels.items())))


def _label(key: object, value: object, path: str) -> tuple[str, str]:
    where = join(join(path, "podLabels"), str(key))
    if not isinstance(key, str) or not _LABEL_KEY.fullmatch(key):
        raise ContractError(where, "is not a label key")
    return key, expect(value, str, where)


def cidrs(doc: dict[str, Any], key: str) -> tuple[str, ...]:
    """CIDRs such as 10.0.0.0/8, as a list or comma-separated; each a network address."""
    value = doc[key]
    items = value.split(",") if isinstance(value, str) else expect(value, list, key)
    found = []
    for i, item in enumerate(i for i in items if not isinstance(i, str) or i.strip()):
        text = expect(item, str, f"{key}[{i}]").strip()
        try:
            found.append(str(ipaddress.ip_network(text)))
        except ValueError as err:
            raise ContractError(f"{key}[{i}]", f"{text!r} is not a CIDR: {err}") from None
    return tuple(found)
