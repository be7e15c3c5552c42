"""The gateway's settings: one versioned YAML file, overridden by flags.

The OpenAI API (and /healthz, /readyz) listens on `host:port`; /metrics on a listener of its
own (`metricsPort`), so clients of the API cannot read other tenants' figures.

Keys are required: without `apiKeysSecret` the gateway refuses to start unless
`allowAnonymous` says, in so many words, that anyone who reaches it may call it. Even then
the one `anonymous` tenant is bounded by the `anonymous*` settings, finite by default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from infergrid.engine_token import KEY_FILE_SETTING
from infergrid.errors import ContractError
from infergrid.settings import Setting, boolean, choice, names, number, text, whole

from .balancer import LEAST_LOADED, POLICIES
from .tenants import ANONYMOUS, TenantLimits

MiB: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str = "0.0.0.0"
    port: int = 8080
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 9090
    namespaces: tuple[str, ...] = ()  # none: every namespace
    api_keys_secret: str = ""  # "namespace/name"; none: no keys, one anonymous tenant
    allow_anonymous: bool = False  # without keys: start anyway, every caller `anonymous`
    anonymous_requests_per_s: float = 20.0
    anonymous_burst: float = 40.0
    anonymous_tokens_per_minute: float = 200_000.0
    anonymous_max_concurrent: int = 32
    anonymous_max_scale_from_zero: int = 1
    anonymous_namespaces: tuple[str, ...] = ()  # none: every namespace served
    routing: str = LEAST_LOADED
    affinity_slack: float = 2.0
    prefix_chars: int = 256
    max_body_bytes: int = 8 * MiB
    tenant_body_bytes: int = 32 * MiB  # request bodies one tenant has in the gateway
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
    engine_token_key_file: str = ""  # none: engines take no token
    engine_token_key: bytes = field(default=b"", repr=False)  # read from it at start

    @property
    def secret(self) -> tuple[str, str] | None:
        if not self.api_keys_secret:
            return None
        namespace, _, name = self.api_keys_secret.partition("/")
        return namespace, name

    @property
    def anonymous(self) -> TenantLimits:
        """The tenant of every caller when no keys are configured."""
        return TenantLimits(
            ANONYMOUS,
            requests_per_s=self.anonymous_requests_per_s,
            burst=self.anonymous_burst,
            tokens_per_minute=self.anonymous_tokens_per_minute,
            max_concurrent=self.anonymous_max_concurrent,
            namespaces=frozenset(self.anonymous_namespaces) or None,
            max_scale_from_zero=self.anonymous_max_scale_from_zero,
        )


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
    if not cfg.api_keys_secret and not cfg.allow_anonymous:
        raise ContractError("apiKeysSecret", "is required (namespace/name of the keys Secret) "
                            "unless allowAnonymous is true")  # fmt: skip
    if cfg.metrics_port and cfg.metrics_port == cfg.port and cfg.metrics_host == cfg.host:
        raise ContractError("metricsPort", f"must differ from port ({cfg.port})")
    if cfg.tenant_body_bytes < cfg.max_body_bytes:
        limit = cfg.max_body_bytes
        raise ContractError("tenantBodyBytes", f"must be at least maxBodyBytes ({limit})")
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
    Setting("allowAnonymous", "allow_anonymous", boolean,
            "without apiKeysSecret, serve every caller as the anonymous tenant", boolean=True),
    Setting("anonymousRequestsPerSecond", "anonymous_requests_per_s", number(0.001, 1e6),
            "the anonymous tenant's requests per second",
            cli="--anonymous-requests-per-second"),
    Setting("anonymousBurst", "anonymous_burst", number(1, 1e6),
            "the anonymous tenant's burst of requests"),
    Setting("anonymousTokensPerMinute", "anonymous_tokens_per_minute", number(1, 1e12),
            "the anonymous tenant's model tokens per minute"),
    Setting("anonymousMaxConcurrent", "anonymous_max_concurrent", whole(1, 1_000_000),
            "the anonymous tenant's requests in flight at once"),
    Setting("anonymousMaxScaleFromZero", "anonymous_max_scale_from_zero", whole(0, 10_000),
            "services the anonymous tenant may wake from zero replicas at once"),
    Setting("anonymousNamespaces", "anonymous_namespaces", names,
            "namespaces the anonymous tenant may call, comma-separated (default: all served)"),
    Setting("routing", "routing", choice(POLICIES), "how a pod is picked within a track"),
    Setting("affinitySlack", "affinity_slack", number(0, 1000),
            "requests of work a conversation's pod may have above the least loaded one"),
    Setting("prefixChars", "prefix_chars", whole(0, 1 << 20),
            "characters of a conversation hashed for affinity (0: no affinity)"),
    Setting("maxBodyBytes", "max_body_bytes", whole(1024, 1 << 30), "largest request body"),
    Setting("tenantBodyBytes", "tenant_body_bytes", whole(1024, 1 << 40),
            "bytes of request bodies one tenant may have in the gateway at once"),
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
    Setting(KEY_FILE_SETTING, "engine_token_key_file", text,
            "file of the key engine tokens derive from (infergrid/engine_token.py); each "
            "forwarded request carries its service's token"),
    Setting("defaultMaxTokens", "default_max_tokens", whole(1, 1 << 20),
            "tokens reserved for an answer without max_tokens, where a service's context "
            "length is not known"),
)  # fmt: skip
