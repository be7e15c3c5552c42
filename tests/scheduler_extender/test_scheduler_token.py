"""kube-scheduler's token: minted with the TokenRequest API for its own ServiceAccount, written
atomically where kube-scheduler reads it, renewed before it runs out, and a failure never
stops the extender."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from kubernetes.client.rest import ApiException
from prometheus_client import REGISTRY

from scheduler_extender.scheduler_token import (
    TOKEN_SECONDS,
    SchedulerToken,
    refresh_at,
    retry_delay_s,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


class TokenApi:
    """The TokenRequest call across the seam: records each request and answers with a token
    (or raises, while `failures` lasts)."""

    def __init__(self, failures: int = 0) -> None:
        self.requests: list[tuple[str, str, dict]] = []
        self.failures = failures

    def create_namespaced_service_account_token(self, name, namespace, body, **_):
        self.requests.append((name, namespace, body))
        if self.failures:
            self.failures -= 1
            raise ApiException(status=403, reason="Forbidden")
        status = {"token": f"token-{len(self.requests)}", "expirationTimestamp": expiry()}
        return SimpleNamespace(data=json.dumps({"status": status}).encode())


def expiry() -> str:
    return (NOW + timedelta(seconds=TOKEN_SECONDS)).isoformat().replace("+00:00", "Z")


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    own, shared = tmp_path / "own", tmp_path / "shared"
    own.mkdir()
    shared.mkdir()
    (own / "ca.crt").write_text("the cluster CA\n")
    return own, shared


def minter(api: TokenApi, dirs: tuple[Path, Path]) -> SchedulerToken:
    own, shared = dirs
    return SchedulerToken(api, "ig-infergrid-scheduler", "infergrid", shared, own, lambda: NOW)


def failures_total() -> float:
    name = "infergrid_scheduler_extender_scheduler_token_failures_total"
    return REGISTRY.get_sample_value(name) or 0


# --- when to refresh ---------------------------------------------------------------------------


def test_a_token_is_renewed_three_quarters_into_its_life():
    assert refresh_at(NOW, NOW + HOUR) == NOW + timedelta(minutes=45)


def test_the_renewal_leaves_client_go_minutes_to_pick_the_new_token_up():
    # kube-scheduler re-reads the file every minute; the renewal comes before 80 % of the life.
    lifetime = timedelta(seconds=TOKEN_SECONDS)
    assert refresh_at(NOW, NOW + lifetime) < NOW + lifetime * 0.8


def test_a_token_that_came_back_expired_is_renewed_at_once():
    assert refresh_at(NOW, NOW - HOUR) == NOW


def test_retries_back_off_to_a_minute():
    assert [retry_delay_s(n) for n in (1, 2, 3, 4, 7, 20)] == [1, 2, 4, 8, 60, 60]


# --- one refresh -------------------------------------------------------------------------------


def test_the_token_is_requested_for_the_schedulers_service_account_with_a_lifetime(dirs):
    api = TokenApi()
    minter(api, dirs).refresh()
    ((name, namespace, body),) = api.requests
    assert (name, namespace) == ("ig-infergrid-scheduler", "infergrid")
    assert body == {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": TOKEN_SECONDS},  # no audiences: the API server's own
    }


def test_the_token_the_ca_and_the_namespace_are_written_where_kube_scheduler_reads_them(dirs):
    token = minter(TokenApi(), dirs).refresh()
    shared = dirs[1]
    assert (shared / "token").read_text() == "token-1"
    assert (shared / "ca.crt").read_text() == "the cluster CA\n"
    assert (shared / "namespace").read_text() == "infergrid"
    assert token.expires == NOW + timedelta(seconds=TOKEN_SECONDS)
    assert sorted(p.name for p in shared.iterdir()) == ["ca.crt", "namespace", "token"]
    assert oct((shared / "token").stat().st_mode & 0o777) == "0o640"


def test_a_new_token_replaces_the_file_rather_than_rewriting_it(dirs):
    m = minter(TokenApi(), dirs)
    m.refresh()
    before = os.stat(dirs[1] / "token").st_ino
    m.refresh()
    assert (dirs[1] / "token").read_text() == "token-2"
    assert os.stat(dirs[1] / "token").st_ino != before  # os.replace: never a half-written file


def test_a_refused_request_writes_nothing(dirs):
    with pytest.raises(ApiException):
        minter(TokenApi(failures=1), dirs).refresh()
    assert list(dirs[1].iterdir()) == []


def test_an_answer_without_a_token_is_an_error_naming_the_field(dirs):
    class Empty(TokenApi):
        def create_namespaced_service_account_token(self, *args, **kw):
            return SimpleNamespace(data=b'{"status": {}}')

    with pytest.raises(ValueError, match="status.token"):
        minter(Empty(), dirs).refresh()
    assert not (dirs[1] / "token").exists()


# --- the loop ----------------------------------------------------------------------------------


def run_until_written(m: SchedulerToken, monkeypatch) -> list[float]:
    """Runs the minter until a token is written; returns the sleeps it took (not slept)."""
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if (m.target / "token").exists():
            raise asyncio.CancelledError

    monkeypatch.setattr("scheduler_extender.scheduler_token.asyncio.sleep", fake_sleep)

    async def go():
        with pytest.raises(asyncio.CancelledError):
            await m.run()

    asyncio.run(go())
    return sleeps


def test_failures_are_counted_and_retried_with_backoff_until_a_token_is_written(dirs, monkeypatch):
    before = failures_total()
    m = minter(TokenApi(failures=3), dirs)
    sleeps = run_until_written(m, monkeypatch)
    assert sleeps == [1, 2, 4, 45 * 60]  # then the next refresh, 3/4 into the token's life
    assert failures_total() == before + 3
    assert (dirs[1] / "token").read_text() == "token-4"


def test_a_missing_ca_is_a_failure_to_retry_not_a_crash(dirs, monkeypatch):
    (dirs[0] / "ca.crt").unlink()
    before = failures_total()
    m = minter(TokenApi(), dirs)
    calls = []

    async def fake_sleep(seconds: float) -> None:
        calls.append(seconds)
        if len(calls) == 2:
            (dirs[0] / "ca.crt").write_text("the cluster CA\n")  # the kubelet catches up
        if (m.target / "token").exists():
            raise asyncio.CancelledError

    monkeypatch.setattr("scheduler_extender.scheduler_token.asyncio.sleep", fake_sleep)

    async def go():
        with pytest.raises(asyncio.CancelledError):
            await m.run()

    asyncio.run(go())
    assert calls == [1, 2, 45 * 60] and failures_total() == before + 2
