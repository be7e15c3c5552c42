"""Two listeners: the unauthenticated verbs on loopback only, /metrics on a listener of its
own, and neither serves the other's paths."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from infergrid.errors import ContractError
from infergrid.settings import add_flags, load_settings
from scheduler_extender.config import SETTINGS, ExtenderConfig, check
from scheduler_extender.main import main
from tests.scheduler_extender.test_http import service

VERBS = ["/filter", "/prioritize", "/bind"]


def status_of(app_name: str, method: str, path: str) -> tuple[int, str]:
    async def go():
        app = getattr(service(), app_name)()
        async with TestClient(TestServer(app)) as http:
            resp = await http.request(method, path, data=b"{}")
            return resp.status, await resp.text()

    return asyncio.run(go())


@pytest.mark.parametrize("path", VERBS)
def test_the_metrics_listener_does_not_serve_the_verbs(path):
    assert status_of("metrics_app", "POST", path)[0] == 404


def test_the_verbs_listener_does_not_serve_metrics():
    assert status_of("app", "GET", "/metrics")[0] == 404


def test_the_metrics_listener_serves_metrics_and_a_health_probe():
    status, text = status_of("metrics_app", "GET", "/metrics")
    assert status == 200 and "infergrid_scheduler_extender_cache_objects" in text
    assert status_of("metrics_app", "GET", "/healthz") == (200, "ok\n")


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_the_verbs_listener_keeps_the_probes(path):
    assert status_of("app", "GET", path)[0] in (200, 503)  # readyz: 503 until synced


def load(*argv: str, config: Path | None = None) -> ExtenderConfig:
    parser = argparse.ArgumentParser()
    add_flags(parser, SETTINGS)
    args = parser.parse_args([*argv, *([f"--config={config}"] if config else [])])
    return check(load_settings(ExtenderConfig(), SETTINGS, args))


def test_by_default_the_verbs_listen_on_loopback_and_metrics_are_not_served():
    cfg = load()
    assert (cfg.host, cfg.port, cfg.metrics_port) == ("127.0.0.1", 8888, 0)
    assert cfg.scheduler_token_dir is None


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1"])
def test_any_loopback_address_may_carry_the_verbs(host):
    assert load("--host", host).host == host


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "localhost"])
def test_a_non_loopback_address_for_the_verbs_is_refused_naming_host(host, tmp_path):
    with pytest.raises(ContractError, match=r"^host: must be a loopback address"):
        load("--host", host)
    (tmp_path / "extender.yaml").write_text(f"version: v1\nhost: '{host}'\n")
    with pytest.raises(ContractError, match=r"^host: must be a loopback address"):
        load(config=tmp_path / "extender.yaml")


def test_the_extender_refuses_to_start_with_the_verbs_on_all_interfaces(capsys):
    assert main(["--host", "0.0.0.0"]) == 2
    assert "host: must be a loopback address" in capsys.readouterr().err


def test_metrics_listen_where_they_are_told():
    cfg = load("--metrics-address", "10.1.2.3", "--metrics-port", "9464")
    assert (cfg.metrics_address, cfg.metrics_port) == ("10.1.2.3", 9464)


def test_metrics_may_not_share_the_verbs_port():
    with pytest.raises(ContractError, match=r"^metricsPort: must differ from port"):
        load("--metrics-port", "8888")


def test_the_scheduler_token_needs_the_service_account_to_mint_it_for():
    with pytest.raises(ContractError, match=r"^schedulerServiceAccount: is required"):
        load("--scheduler-token-dir", "/run/token")
    cfg = load("--scheduler-token-dir", "/run/token", "--scheduler-service-account", "ks")
    assert cfg.scheduler_token_dir == Path("/run/token")
    assert load("--scheduler-token-dir", "").scheduler_token_dir is None  # empty: off
