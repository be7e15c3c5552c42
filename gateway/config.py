"""The gateway's settings: one versioned YAML file, overridden by flags.

The OpenAI API (and /healthz, /readyz) listens on `host:port`; /metrics on a listener of its
own (`metricsPort`), so clients of the API cannot read other tenants' figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from infergrid.errors import ContractError
from infergrid.settings import Setting, boolean, choice, names, number, text, whole

from .balancer import LEAST_LOADED, POLICIES

MiB: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str = "0.0.0.0"
    port: int = 8080
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 9090
    namespaces: tuple[str, ...] = ()  # none: every namespace
    api_keys_secret: str = ""  # "namespace/name"; none: no keys, one anonymous tenant
    routing: str = LEAST_LOADED
    affinity_slack: float = 2.0
    prefix_chars: int = 256
    max_body_bytes: int = 8 * MiB
    read_timeout_s: float = 30.0
    upstream_timeout_s: float = 600.0
    connect_timeout_s: float = 2.0
    hold_queue: int = 64
    hold_timeout_s: float = 120.0
    scale_from_zero: bool = True
    scrape_interval_s: float = 1.0
    scrape_timeout_s: float = 1.0
    failure_cooldown_s: float = 5.0
    secret_refresh_s: float = 10.0
    drain_s: float = 30.0
    default_max_tokens: int = 256

    @property
    def secret(self) -> tuple[str, str] | None:
        if not self.api_keys_secret:
            return None
        namespace, _, name = self.api_keys_secret.partition("/")
        return namespace, name


def secret_ref(doc: dict[str, Any], key: str) -> str:
    """`namespace/name` of a Secret, or empty for none."""
    value = doc[key]
    if value == "":
        return ""
    value = text(doc, key)
    namespace, slash, name = value.partition("/")
    if not (slash and namespace and name) or "/" in name:
        raise ContractError(key, f"expected namespace/name, got {value!r}")
    return value


def check(cfg: GatewayConfig) -> GatewayConfig:
    if cfg.metrics_port and cfg.metrics_port == cfg.port and cfg.metrics_host == cfg.host:
        raise ContractError("metricsPort", f"must differ from port ({cfg.port})")
    return cfg


SETTINGS: Final = (
    Setting("host", "host", text, "address of the OpenAI API"),
    Setting("port", "port", whole(1, 65535), "port of the OpenAI API"),
    Setting("metricsHost", "metrics_host", text, "address of /metrics"),
    Setting("metricsPort", "metrics_port", whole(0, 65535), "port of /metrics (0: not served)"),
    Setting("namespaces", "namespaces", names,
            "namespaces whose InferenceServices are served, comma-separated (default: all)"),
    Setting("apiKeysSecret", "api_keys_secret", secret_ref,
            "namespace/name of the Secret holding tenants.yaml; set, every request needs a key"),
    Setting("routing", "routing", choice(POLICIES), "how a pod is picked within a track"),
    Setting("affinitySlack", "affinity_slack", number(0, 1000),
            "requests of work a conversation's pod may have above the least loaded one"),
    Setting("prefixChars", "prefix_chars", whole(0, 1 << 20),
            "characters of a conversation hashed for affinity (0: no affinity)"),
    Setting("maxBodyBytes", "max_body_bytes", whole(1024, 1 << 30), "largest request body"),
    Setting("readTimeoutSeconds", "read_timeout_s", number(0.1, 3600),
            "time a client has to send its request"),
    Setting("upstreamTimeoutSeconds", "upstream_timeout_s", number(1, 86400),
            "time an engine has to finish an answer"),
    Setting("connectTimeoutSeconds", "connect_timeout_s", number(0.05, 60),
            "time to connect to an engine pod"),
    Setting("holdQueue", "hold_queue", whole(0, 100000),
            "requests held per service while it has no ready pod"),
    Setting("holdTimeoutSeconds", "hold_timeout_s", number(0, 3600),
            "how long a request is held for a pod to become ready"),
    Setting("scaleFromZero", "scale_from_zero", boolean,
            "ask for one replica of a service at zero replicas", boolean=True),
    Setting("scrapeIntervalSeconds", "scrape_interval_s", number(0.1, 600),
            "how often each engine's /metrics is read for its queue depth"),
    Setting("scrapeTimeoutSeconds", "scrape_timeout_s", number(0.05, 60),
            "how long one scrape may take"),
    Setting("failureCooldownSeconds", "failure_cooldown_s", number(0, 600),
            "how long a pod that failed a request gets no new ones"),
    Setting("secretRefreshSeconds", "secret_refresh_s", number(1, 3600),
            "how often the keys Secret is read again"),
    Setting("drainSeconds", "drain_s", number(0, 3600),
            "time given to requests in flight after SIGTERM"),
    Setting("defaultMaxTokens", "default_max_tokens", whole(1, 1 << 20),
            "tokens charged to a tenant for a request that names no max_tokens"),
)  # fmt: skip
