"""The extender's settings: one versioned YAML file, overridden by flags."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from infergrid import settings as s
from infergrid.constants import DEFAULT_POLICY, PLACEMENT_POLICIES


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
    s.Setting("host", "host", s.text, "address to listen on"),
    s.Setting("port", "port", s.whole(1, 65535), "port to listen on"),
    s.Setting("defaultPolicy", "default_policy", s.choice(PLACEMENT_POLICIES),
              "policy for pods without the placement-policy annotation"),
    s.Setting("staleAfterSeconds", "stale_after_s", s.number(1, 3600),
              "a node whose usage heartbeat is older offers nothing"),
    s.Setting("leaderElection", "leader_election", s.boolean,
              "take a Lease; only the leader binds and is ready", boolean=True),
    s.Setting("leaseNamespace", "lease_namespace", s.text, "namespace of the Lease"),
    s.Setting("leaseName", "lease_name", s.text, "name of the Lease"),
    s.Setting("identity", "identity", s.text, "name in the Lease (default POD_NAME)"),
    s.Setting("tlsCertFile", "tls_cert_file", s.path, "serve HTTPS with this certificate"),
    s.Setting("tlsKeyFile", "tls_key_file", s.path, "and this key"),
    s.Setting("resyncSeconds", "resync_s", s.number(10, 86400), "full relist period of the cache"),
    s.Setting("bindWaitSeconds", "bind_wait_s", s.number(0, 10),
              "longest a filter waits for pods that passed filter to be bound (0: never)"),
)  # fmt: skip
