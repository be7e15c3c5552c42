"""The keys Secret, re-read while the gateway runs: what each kind of failure does."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from gateway import main
from gateway.kube import KeysSecretGone
from gateway.tenants import parse_tenants
from infergrid.errors import ContractError

KEY = "sk-team-a-0123456789"
TABLE = parse_tenants(f"version: v1\ntenants: [{{name: team-a, keys: [{KEY}]}}]")


def refreshed(monkeypatch, answers: list, keys=None) -> SimpleNamespace:
    """The gateway's key table after `_refresh_keys` met each answer in turn (a table, or an
    error to raise), one refresh period apart."""
    gateway = SimpleNamespace(
        cfg=SimpleNamespace(secret=("infergrid", "keys"), secret_refresh_s=0.001), keys=keys
    )
    seen: list = []

    def read_keys(api, namespace, name):
        answer = answers[min(len(seen), len(answers) - 1)]
        seen.append(answer)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(main, "read_keys", read_keys)

    async def run() -> None:
        task = asyncio.ensure_future(main._refresh_keys(gateway, api=None))
        while len(seen) <= len(answers):
            await asyncio.sleep(0.001)
        task.cancel()

    asyncio.run(run())
    return gateway


def test_a_deleted_secret_revokes_every_key(monkeypatch):
    gone = KeysSecretGone("Secret infergrid/keys", "not found: every API key is refused")
    gateway = refreshed(monkeypatch, [TABLE, gone])
    assert gateway.keys is not None and gateway.keys.tenant(KEY) is None


@pytest.mark.parametrize(
    "failure",
    [ContractError("Secret infergrid/keys", "cannot be read: 500 Internal Server Error"),
     ContractError("Secret infergrid/keys data.tenants.yaml", "not valid YAML")],
    ids=["unreadable", "malformed"],
)  # fmt: skip
def test_an_unreadable_or_broken_secret_keeps_the_last_good_keys(monkeypatch, failure):
    gateway = refreshed(monkeypatch, [TABLE, failure])
    assert gateway.keys.tenant(KEY).name == "team-a"


def test_a_secret_missing_from_the_start_keeps_the_gateway_without_keys(monkeypatch):
    """No table yet: the gateway stays unready (docs/gateway.md), rather than ready refusing all."""
    gone = KeysSecretGone("Secret infergrid/keys", "not found: every API key is refused")
    assert refreshed(monkeypatch, [gone]).keys is None
