"""The operator's settings: one versioned YAML file, overridden by flags."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

from infergrid.codec import expect, join
from infergrid.constants import SCHEDULER_NAME
from infergrid.engine_token import KEY_FILE_SETTING
from infergrid.errors import ContractError
from infergrid.runtimes import RUNTIMES
from infergrid.settings import Setting, boolean, class_names, names, number, text, whole
from infergrid.storage_uri import parse_storage_uri

from .engine_access import Caller, callers, cidrs

DEFAULT_ENGINE_IMAGE: Final = "infergrid/engine:0.1.0"
# {port} is the service's runtime's (8000 for the bundled engine, infergrid/runtimes.py).
DEFAULT_METRICS_URL: Final = "http://{pod_ip}:{port}/metrics"
URL_FIELDS: Final = {"pod_ip": "10.0.0.1", "pod_name": "p", "namespace": "ns", "port": 8000}


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    scheduler_name: str = SCHEDULER_NAME
    engine_image: str = DEFAULT_ENGINE_IMAGE
    # The image of each other runtime for services whose spec names none, as (runtime, image).
    runtime_images: tuple[tuple[str, str], ...] = ()
    namespaces: tuple[str, ...] = ()  # none: every namespace
    metrics_url_template: str = DEFAULT_METRICS_URL
    scrape_timeout_s: float = 2.0
    liveness_endpoint: str = "http://0.0.0.0:8080/healthz"
    max_workers: int = 20
    hf_cache_claim: str = ""  # none: hf:// is served only where downloads are allowed
    allow_model_download: bool = False
    allowed_priority_classes: tuple[str, ...] = ()  # none: services may name no class
    gpu_fault_grace_s: float = 60.0  # before a pod on an unhealthy GPU is replaced
    gateway_metrics_url: str = ""  # none: no gateway, no pending requests to scale on
    # Who may call engines (engine_access.py): off, engines take calls from any pod.
    engine_network_policy: bool = False
    engine_callers: tuple[Caller, ...] = ()
    engine_ingress_cidrs: tuple[str, ...] = ()
    engine_token_key_file: str = ""  # none: engines take no token
    engine_token_key: bytes = field(default=b"", repr=False)  # read from it at start


NAMESPACE_PATTERN_CHARS: Final = "*?[]!"
"""What makes an entry of `namespaces` one of kopf's patterns rather than a name."""


def scans_namespaces(namespaces: tuple[str, ...]) -> bool:
    """Whether kopf must list and watch the cluster's namespaces to know which it serves: only
    for patterns. Named ones are served as they are, with no cluster-scope right (the chart
    gives none) and without kopf's minute of retries when it has none."""
    return any(ch in name for name in namespaces for ch in NAMESPACE_PATTERN_CHARS)


def url_template(doc: dict[str, Any], key: str) -> str:
    """A URL with {pod_ip}, {pod_name}, {namespace} or {port} in it, checked once at start."""
    value = text(doc, key)
    try:
        value.format(**URL_FIELDS)
    except (KeyError, IndexError, ValueError) as err:
        raise ContractError(
            key, f"only {{pod_ip}}, {{pod_name}}, {{namespace}}, {{port}} may appear: {err}"
        ) from err
    return value


def http_url(doc: dict[str, Any], key: str) -> str:
    """An http(s) URL with a host; empty means none."""
    if doc[key] == "":
        return ""
    value = text(doc, key)
    try:
        parts = urlsplit(value)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a bracket left open, a port that is no number
        usable = False
    if not usable:
        raise ContractError(key, f"{value!r} is not an http:// or https:// URL with a host")
    return value


def runtime_images(doc: dict[str, Any], key: str) -> tuple[tuple[str, str], ...]:
    """Runtime name -> image, for the table's runtimes other than the bundled engine (whose
    image is engineImage); on the command line the same map as JSON."""
    value = doc[key]
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as err:
            raise ContractError(key, f"expected a JSON object: {err}") from None
    known = [name for name in RUNTIMES if name != "infergrid"]
    pairs = []
    for name, image in expect(value, dict, key).items():
        if name not in known:
            raise ContractError(join(key, str(name)), f"is not one of {', '.join(known)}")
        if not isinstance(image, str) or not image.strip():
            raise ContractError(join(key, name), "must be an image reference")
        pairs.append((name, image))
    return tuple(sorted(pairs))


def claim_name(doc: dict[str, Any], key: str) -> str:
    """A PersistentVolumeClaim's name, checked as pvc:// checks it; empty means none."""
    if doc[key] == "":
        return ""
    value = text(doc, key)
    try:
        claim = parse_storage_uri(f"pvc://{value}", key)
    except ContractError:
        claim = None
    if claim is None or claim.path or claim.name != value:
        raise ContractError(
            key, f"{value!r} is not a claim name (lowercase RFC 1123, e.g. hf-cache)"
        )
    return value


SETTINGS: Final = (
    Setting("schedulerName", "scheduler_name", text,
            "scheduler of engine pods whose spec names none"),
    Setting("engineImage", "engine_image", text,
            "engine image of services whose spec names none"),
    Setting("runtimeImages", "runtime_images", runtime_images,
            "image of each runtime other than infergrid for services whose spec names none, "
            'e.g. {"llama.cpp": "infergrid/llama-cpp:0.1.0"} (a flag: as JSON)'),
    Setting("namespaces", "namespaces", names,
            "namespaces to serve, comma-separated (default: all)"),
    Setting("metricsUrlTemplate", "metrics_url_template", url_template,
            "where an engine pod's metrics are read, e.g. http://{pod_ip}:8000/metrics"),
    Setting("scrapeTimeoutSeconds", "scrape_timeout_s", number(0.1, 60),
            "how long one scrape of a pod may take"),
    Setting("livenessEndpoint", "liveness_endpoint", text,
            "URL the liveness probe is served on"),
    Setting("maxWorkers", "max_workers", whole(1, 256), "threads for the handlers"),
    Setting("hfCacheClaim", "hf_cache_claim", claim_name,
            "claim in each service's namespace holding an HF_HOME cache, for hf:// models"),
    Setting("allowModelDownload", "allow_model_download", boolean,
            "let engines download hf:// models their cache lacks", boolean=True),
    Setting("allowedPriorityClasses", "allowed_priority_classes",
            class_names("never given to engines"),
            "priority classes services may give their engines, comma-separated (default: "
            "none); system-* is always refused"),
    Setting("gpuFaultGraceSeconds", "gpu_fault_grace_s", number(0, 86400),
            "seconds a pod's GPU stays unhealthy before the pod is replaced (default 60)"),
    Setting("gatewayMetricsUrl", "gateway_metrics_url", http_url,
            "the gateway's metrics URL, e.g. http://infergrid-gateway-metrics.infergrid.svc:9090"
            "/metrics: its requests held for a service with no ready pod count as demand "
            "(default: none, no gateway)"),
    Setting("engineNetworkPolicy", "engine_network_policy", boolean,
            "render a NetworkPolicy per service admitting only engineCallers, "
            "engineIngressCidrs and, by spec.network.allowSameNamespace, its namespace",
            boolean=True),
    Setting("engineCallers", "engine_callers", callers,
            "pods admitted to engines: a list of {namespace, podLabels} (a flag: as JSON), "
            "e.g. the gateway's and the operator's"),
    Setting("engineIngressCidrs", "engine_ingress_cidrs", cidrs,
            "CIDRs admitted to engines, comma-separated: callers outside the pod network"),
    Setting(KEY_FILE_SETTING, "engine_token_key_file", text,
            "file of the key engine tokens derive from (infergrid/engine_token.py): each "
            "service's engines then answer only its token, which the gateway sends"),
)  # fmt: skip
