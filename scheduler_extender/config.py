"""The extender's settings: one versioned YAML file, overridden by flags."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from infergrid.constants import DEFAULT_POLICY, PLACEMENT_POLICIES
from infergrid.settings import Setting, boolean, choice, number, path, text, whole


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    host: str = "0.0.0.0"
    port: int = 8888
    default_policy: str = DEFAULT_POLICY
    stale_after_s: float = 30.0
    leader_election: bool = True
    lease_namespace: str = "kube-system"
    lease_name: str = "infergrid-scheduler-extender"
    identity: str = ""
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    resync_s: float = 300.0
    bind_wait_s: float = 2.0

    def replica_identity(self) -> str:
        return (
            self.identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
        )


SETTINGS: Final = (
    Setting("host", "host", text, "address to listen on"),
    Setting("port", "port", whole(1, 65535), "port to listen on"),
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
)  # fmt: skip
