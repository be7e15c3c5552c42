"""The gateway's settings: a bad value fails at start, naming the key or the flag."""

from __future__ import annotations

import argparse
import math

import pytest

from gateway.config import SETTINGS, GatewayConfig, check
from gateway.tenants import TenantLimits
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
        from_flags("--port", "9090", "--api-keys-secret", "ig/keys")
    assert caught.value.field == "metricsPort"


def test_keys_are_required_unless_anonymous_callers_are_allowed_in_so_many_words():
    with pytest.raises(ContractError) as caught:
        from_flags()
    assert caught.value.field == "apiKeysSecret"
    assert "allowAnonymous" in caught.value.reason
    assert from_flags("--allow-anonymous").secret is None


def test_the_anonymous_tenant_is_bounded_by_default_and_by_its_settings():
    default = from_flags("--allow-anonymous").anonymous
    assert default.name == "anonymous" and default.namespaces is None
    finite = (default.requests_per_s, default.burst, default.tokens_per_minute)
    assert all(math.isfinite(v) for v in finite)
    assert default.max_concurrent is not None and default.max_scale_from_zero >= 0
    cfg = from_flags("--allow-anonymous", "--anonymous-requests-per-second", "2",
                     "--anonymous-burst", "3", "--anonymous-tokens-per-minute", "1000",
                     "--anonymous-max-concurrent", "4", "--anonymous-max-scale-from-zero", "0",
                     "--anonymous-namespaces", "demo, public")  # fmt: skip
    assert cfg.anonymous == TenantLimits("anonymous", 2.0, 3.0, 1000.0, 4,
                                         frozenset({"demo", "public"}), 0)  # fmt: skip


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"allowAnonymous": "yes"}, "allowAnonymous"),
        ({"anonymousRequestsPerSecond": 0}, "anonymousRequestsPerSecond"),
        ({"anonymousBurst": 0.5}, "anonymousBurst"),
        ({"anonymousTokensPerMinute": ".inf"}, "anonymousTokensPerMinute"),
        ({"anonymousMaxConcurrent": 0}, "anonymousMaxConcurrent"),
        ({"anonymousMaxScaleFromZero": -1}, "anonymousMaxScaleFromZero"),
        ({"anonymousNamespaces": [1]}, "anonymousNamespaces"),
    ],
)
def test_a_bad_anonymous_limit_names_its_key(doc, field):
    with pytest.raises(ContractError) as caught:
        parse_settings({"version": "v1", **doc}, SETTINGS)
    assert caught.value.field == field
