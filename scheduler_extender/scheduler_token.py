"""kube-scheduler's API token, minted by the extender beside it and renewed before it expires.

kube-scheduler and the extender share a pod but not an identity: the pod's own projected
token is the extender's, mounted only into the extender. Rather than a long-lived token
from a `kubernetes.io/service-account-token` Secret, the extender asks the TokenRequest API
for a token of kube-scheduler's ServiceAccount (`TOKEN_SECONDS` long, the API server's
default audience) and writes `token`, `ca.crt` and `namespace` into a directory the two
containers share, each file replaced atomically; client-go re-reads the token file every
minute. A new token is minted once `REFRESH_FRACTION` of the old one's life has passed, so a
failing API server leaves a quarter of the lifetime for the retries.

The token is not bound to the pod: the API server refuses to bind a token of one
ServiceAccount to a pod that runs as another ("cannot bind token for serviceaccount ... to
pod running with different serviceaccount name"), so its lifetime is its only bound.

`token` is written last: the chart's startup probe waits for it, and until then
kube-scheduler has no credentials.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from scheduler_extender import metrics

log = logging.getLogger(__name__)

TOKEN_SECONDS = 3600
"""The lifetime asked for; the kubelet's own projected tokens last about as long."""
REFRESH_FRACTION = 0.75
"""Mint the next token three quarters into the current one's life."""
RETRY_MAX_S = 60.0
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""The extender's own credentials: `ca.crt` and `namespace` are copied from here."""


class TokenApi(Protocol):
    """The one CoreV1Api call used, so tests can stand in for the API server."""

    def create_namespaced_service_account_token(
        self, name: str, namespace: str, body: dict[str, Any], **kwargs: Any
    ) -> Any: ...


@dataclass(frozen=True, slots=True)
class IssuedToken:
    token: str
    issued: datetime
    expires: datetime


def refresh_at(issued: datetime, expires: datetime) -> datetime:
    """When to mint the next token: `REFRESH_FRACTION` into this one's life (at once for a
    token that came back already expired)."""
    return issued + max(expires - issued, timedelta(0)) * REFRESH_FRACTION


def retry_delay_s(failures: int) -> float:
    """Seconds before the next try after `failures` failures in a row: 1, 2, 4 ... 60."""
    return min(2.0 ** (failures - 1), RETRY_MAX_S)


def token_request(seconds: int = TOKEN_SECONDS) -> dict[str, Any]:
    """The TokenRequest body: a lifetime, and no audiences (the API server's own)."""
    return {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": seconds},
    }


def issued_token(doc: dict[str, Any], issued: datetime) -> IssuedToken:
    """The token in a TokenRequest answer; ValueError naming the field when it is not there."""
    status = doc.get("status") or {}
    token, expires = status.get("token"), status.get("expirationTimestamp")
    if not isinstance(token, str) or not token:
        raise ValueError("the TokenRequest answer has no status.token")
    if not isinstance(expires, str):
        raise ValueError("the TokenRequest answer has no status.expirationTimestamp")
    return IssuedToken(token, issued, datetime.fromisoformat(expires))


def write_atomically(directory: Path, name: str, data: bytes) -> None:
    """Write `directory/name` so that a reader sees the old file or the new, never half."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), 0o640)
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, directory / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class SchedulerToken:
    """Mints `service_account`'s token in `namespace` and keeps `target` up to date."""

    api: TokenApi
    service_account: str
    namespace: str
    target: Path
    source: Path = SERVICE_ACCOUNT_DIR
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)

    def refresh(self) -> IssuedToken:
        """One TokenRequest, and the three files written (blocking: run it off the loop)."""
        issued = self.clock()
        raw = self.api.create_namespaced_service_account_token(
            self.service_account, self.namespace, token_request(), _preload_content=False
        )
        token = issued_token(json.loads(raw.data), issued)
        write_atomically(self.target, "ca.crt", (self.source / "ca.crt").read_bytes())
        write_atomically(self.target, "namespace", self.namespace.encode())
        write_atomically(self.target, "token", token.token.encode())
        metrics.SCHEDULER_TOKEN_EXPIRY.set(token.expires.timestamp())
        return token

    async def run(self) -> None:
        """Refresh for ever, retrying failures with backoff; a failure is logged and counted,
        never raised: the extender goes on serving (kube-scheduler keeps the last token)."""
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            try:
                token = await loop.run_in_executor(None, self.refresh)
            except Exception as err:  # noqa: BLE001 - a failure here must not stop the extender
                failures += 1
                metrics.SCHEDULER_TOKEN_FAILURES.inc()
                delay = retry_delay_s(failures)
                log.warning("kube-scheduler's token: %s; retrying in %.0f s", err, delay)
            else:
                failures = 0
                delay = (refresh_at(token.issued, token.expires) - self.clock()).total_seconds()
                log.info("kube-scheduler's token written; it expires at %s", token.expires)
            await asyncio.sleep(max(delay, 1.0))  # never a busy loop
