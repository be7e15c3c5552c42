"""The extender's settings: one versioned YAML file, overridden by flags.

The verbs (/filter, /prioritize, /bind) carry no authentication, so their listener binds
a loopback address only, reachable from kube-scheduler in the same pod and nothing else;
/metrics has a listener of its own (`metricsAddress`, `metricsPort`), off unless a port
is given.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from infergrid.constants import DEFAULT_POLICY, PLACEMENT_POLICIES
from infergrid.errors import ContractError
from infergrid.placement.preemption import NO_CLASS
from infergrid.settings import (
    Setting,
    boolean,
    choice,
    class_names,
    number,
    path,
    text,
    whole,
)

DEFAULT_PREEMPTIBLE: Final = frozenset({"infergrid-offline"})
"""The chart's offline class: the one class whose pods agree, by default, to be evicted for
an online pod's GPU room."""


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    host: str = "127.0.0.1"
    port: int = 8888
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 0
    default_policy: str = DEFAULT_POLICY
    stale_after_s: float = 30.0
    leader_election: bool = True
    lease_namespace: str = "kube-system"
    lease_name: str = "infergrid-scheduler-extender"
    identity: str = ""
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    resync_s: float = 300.0
    bind_wait_s: float = 0.0
    tentative_reservation_s: float = 10.0
    preemption_hold_s: float = 60.0
    scheduler_token_dir: Path | None = None
    scheduler_service_account: str = ""
    preemptible_classes: tuple[str, ...] = tuple(DEFAULT_PREEMPTIBLE)
    preempt_pods_without_class: bool = False

    def preemptible(self) -> frozenset[str]:
        """The classes whose GPU holders may be victims, NO_CLASS among them if pods that
        name no class may be."""
        without_class = {NO_CLASS} if self.preempt_pods_without_class else set()
        return frozenset(self.preemptible_classes) | without_class

    def replica_identity(self) -> str:
        return (
            self.identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
        )


def loopback(doc: dict[str, Any], key: str) -> str:
    """A loopback IP address: the verbs' listener must not be reachable from the network."""
    value = text(doc, key)
    try:
        ok = ipaddress.ip_address(value).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise ContractError(
            key,
            f"must be a loopback address such as 127.0.0.1, got {value!r}: /filter, "
            "/prioritize and /bind are unauthenticated (metricsAddress serves /metrics)",
        )
    return value


def optional_path(doc: dict[str, Any], key: str) -> Path | None:
    """A path, or None for an empty value (the feature is off)."""
    return None if doc[key] in ("", None) else path(doc, key)


def check(cfg: ExtenderConfig) -> ExtenderConfig:
    """The checks that span settings, each error naming the setting to change."""
    if cfg.metrics_port and cfg.metrics_port == cfg.port:
        raise ContractError("metricsPort", f"must differ from port ({cfg.port})")
    if cfg.scheduler_token_dir is not None and not cfg.scheduler_service_account:
        raise ContractError("schedulerServiceAccount", "is required with schedulerTokenDir")
    return cfg


SETTINGS: Final = (
    Setting("host", "host", loopback,
              "loopback address of /filter, /prioritize, /bind, /healthz and /readyz"),
    Setting("port", "port", whole(1, 65535), "port of those"),
    Setting("metricsAddress", "metrics_address", text, "address of /metrics and /healthz"),
    Setting("metricsPort", "metrics_port", whole(0, 65535), "port of those (0: not served)"),
    Setting("defaultPolicy", "default_policy", choice(PLACEMENT_POLICIES),
              "policy for pods without the placement-policy annotation"),
    Setting("staleAfterSeconds", "stale_after_s", number(1, 3600),
              "a node whose usage heartbeat is older offers nothing"),
    Setting("leaderElection", "leader_election", boolean,
              "take a Lease; only the leader binds and is ready", boolean=True),
    Setting("leaseNamespace", "lease_namespace", text, "namespace of the Lease"),
    Setting("leaseName", "lease_name", text, "name of the Lease"),
    Setting("identity", "identity", text, "name in the Lease (default POD_NAME)"),
    Setting("tlsCertFile", "tls_cert_file", path, "serve HTTPS with this certificate"),
    Setting("tlsKeyFile", "tls_key_file", path, "and this key"),
    Setting("resyncSeconds", "resync_s", number(10, 86400), "full relist period of the cache"),
    Setting("bindWaitSeconds", "bind_wait_s", number(0, 10),
              "longest a filter waits for pods that passed filter to be bound (0: never)"),
    Setting("tentativeReservationSeconds", "tentative_reservation_s", number(0, 300),
              "prioritize holds a pod's placement on its top node until bind, at most this "
              "long (0: off)"),
    Setting("preemptionHoldSeconds", "preemption_hold_s", number(0, 600),
              "when no node takes a pod that may preempt, evict the fewest lower-priority GPU "
              "holders and hold their room for it this long (0: leave preemption to "
              "kube-scheduler alone)"),
    Setting("preemptibleClasses", "preemptible_classes", class_names("never preempted"),
              "PriorityClasses whose GPU holders preemption may evict (never system-*)"),
    Setting("preemptPodsWithoutClass", "preempt_pods_without_class", boolean,
              "GPU holders that name no PriorityClass may be evicted too", boolean=True),
    Setting("schedulerTokenDir", "scheduler_token_dir", optional_path,
              "write kube-scheduler's API token, ca.crt and namespace here (empty: don't)"),
    Setting("schedulerServiceAccount", "scheduler_service_account", text,
              "kube-scheduler's ServiceAccount, in this pod's namespace"),
)  # fmt: skip
