"""The gateway's settings: a bad value fails at start, naming the key or the flag."""

from __future__ import annotations

import argparse

import pytest

from gateway.config import SETTINGS, GatewayConfig, check
from infergrid.errors import ContractError
from infergrid.settings import add_flags, load_settings, parse_settings


def from_flags(*argv: str) -> GatewayConfig:
    parser = argparse.ArgumentParser()
    add_flags(parser, SETTINGS)
    return check(load_settings(GatewayConfig(), SETTINGS, parser.parse_args(list(argv))))


def test_flags_override_the_defaults():
    cfg = from_flags("--port", "9000", "--namespaces", "a, b", "--api-keys-secret", "ig/keys",
                     "--routing", "round-robin", "--no-scale-from-zero")  # fmt: skip
    assert (cfg.port, cfg.namespaces, cfg.secret) == (9000, ("a", "b"), ("ig", "keys"))
    assert cfg.routing == "round-robin" and cfg.scale_from_zero is False


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"apiKeysSecret": "keys"}, "apiKeysSecret"),
        ({"apiKeysSecret": "a/b/c"}, "apiKeysSecret"),
        ({"routing": "fastest"}, "routing"),
        ({"holdQueue": -1}, "holdQueue"),
        ({"maxBodyBytes": 10}, "maxBodyBytes"),
        ({"scaleFromZero": "yes"}, "scaleFromZero"),
        ({"holdTimeout": 5}, "holdTimeout"),
    ],
)
def test_a_bad_settings_file_names_the_key(doc, field):
    with pytest.raises(ContractError) as caught:
        parse_settings({"version": "v1", **doc}, SETTINGS)
    assert caught.value.field == field


def test_metrics_may_not_share_the_api_port():
    with pytest.raises(ContractError) as caught:
        from_flags("--port", "9090")
    assert caught.value.field == "metricsPort"
