"""The keys Secret: every refusal names its field, so a typo cannot lift a limit."""

from __future__ import annotations

import hashlib
import math

import pytest

from gateway.tenants import SCALE_FROM_ZERO, KeyTable, TenantLimits, parse_tenants
from infergrid.errors import ContractError

GOOD = """
version: v1
tenants:
  - name: team-a
    keys: [sk-team-a-0123456789]
    requestsPerSecond: 5
    burst: 10
    tokensPerMinute: 20000
    maxConcurrent: 8
    maxScaleFromZero: 0
  - name: team-b
    keys: [sk-team-b-0123456789, sk-team-b-abcdefghij]
    namespaces: [team-b, shared]
"""

# The digest of k123456789abcdefg, as `printf %s KEY | sha256sum` gives it.
DIGEST = hashlib.sha256(b"k123456789abcdefg").hexdigest()


def test_keys_map_to_their_tenants_limits():
    table = parse_tenants(GOOD)
    a = table.tenant("sk-team-a-0123456789")
    assert a == TenantLimits("team-a", 5.0, 10.0, 20000.0, 8, max_scale_from_zero=0)
    b = table.tenant("sk-team-b-abcdefghij")
    assert b is not None and b.name == "team-b"
    assert b.max_scale_from_zero == SCALE_FROM_ZERO
    assert math.isinf(b.requests_per_s) and b.max_concurrent is None
    assert b.may_call("shared") and not b.may_call("team-a")
    assert a.namespaces is None and a.may_call("anything")
    assert table.tenant("sk-team-a-012345678") is None  # one character short
    assert sorted(t.name for t in table.tenants()) == ["team-a", "team-b"]


def test_a_rate_without_a_burst_allows_one_second_of_it():
    table = parse_tenants("version: v1\ntenants: [{name: a, keys: [k123456789abcdefg], "
                          "requestsPerSecond: 0.5}]")  # fmt: skip
    assert table.tenant("k123456789abcdefg").burst == 1.0


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("version: v1\ntenants: [{name: a, keys: [k123456789abcdefg], requestPerSecond: 5}]",
         "tenants.yaml.tenants[0].requestPerSecond", "unknown field"),
        ("version: v1\ntenants: [{name: a, keys: [short]}]",
         "tenants.yaml.tenants[0].keys[0]", "at least 16"),
        ("version: v1\ntenants: [{name: a, keys: []}]", "tenants.yaml.tenants[0].keys",
         "at least one key"),
        ("version: v1\ntenants: [{name: a, keys: [k123456789abcdefg], burst: -1}]",
         "tenants.yaml.tenants[0].burst", "above 0"),
        ("version: v1\ntenants: [{name: a, keys: [k123456789abcdefg], maxConcurrent: 0}]",
         "tenants.yaml.tenants[0].maxConcurrent", "at least 1"),
        ("version: v1\ntenants: [{name: a, keys: [k123456789abcdefg], tokensPerMinute: .inf}]",
         "tenants.yaml.tenants[0].tokensPerMinute", "expected a number"),
        ("version: v1\ntenants: [{name: a, keys: [k123456789abcdefg]}, "
         "{name: b, keys: [k123456789abcdefg]}]", "tenants.yaml.tenants[1].keys[0]",
         f"API key 'sha256:{DIGEST}' appears more than once"),
        (f"version: v1\ntenants: [{{name: a, keys: [k123456789abcdefg, 'sha256:{DIGEST}']}}]",
         "tenants.yaml.tenants[0].keys[1]", "appears more than once"),
        ("version: v1\ntenants: [{name: a, keys: ['sha256:abc']}]",
         "tenants.yaml.tenants[0].keys[0]", "64 lowercase hex digits"),
        (f"version: v1\ntenants: [{{name: a, keys: ['sha256:{DIGEST.upper()}']}}]",
         "tenants.yaml.tenants[0].keys[0]", "64 lowercase hex digits"),
        ("version: v1\ntenants: [{name: a, keys: [k123456789abcdefg]}, "
         "{name: a, keys: [k123456789abcdefh]}]", "tenants.yaml.tenants[1].name",
         "more than once"),
        ("version: v2\ntenants: []", "version", "unsupported"),
        ("version: v1\ntenants: [{name: a, keys: ['key with spaces inside']}]",
         "tenants.yaml.tenants[0].keys[0]", "no spaces"),
        ("version: v1\ntenants: [{name: a, keys: [k123456789abcdefg]", "tenants.yaml",
         "not valid YAML"),
        ("- a\n- b", "tenants.yaml", "expected object"),
        ("version: v1\ntenants: [{name: a, keys: [k123456789abcdefg], namespaces: [7]}]",
         "tenants.yaml.tenants[0].namespaces[0]", "expected string"),
        ("version: v1\ntenants: [{name: a, keys: [k123456789abcdefg], maxScaleFromZero: -1}]",
         "tenants.yaml.tenants[0].maxScaleFromZero", "at least 0"),
        ("version: v1\ntenants: [{name: a, keys: [k123456789abcdefg], maxScaleFromZero: 1.5}]",
         "tenants.yaml.tenants[0].maxScaleFromZero", "integer"),
    ],
)  # fmt: skip
def test_a_bad_secret_is_refused_naming_the_field(text, field, reason):
    with pytest.raises(ContractError) as caught:
        parse_tenants(text)
    assert caught.value.field == field
    assert reason in caught.value.reason


def test_keys_are_held_only_as_digests():
    table = parse_tenants(GOOD)
    assert isinstance(table, KeyTable)
    assert all(len(d) == 32 for d in table.digests)
    assert "sk-team-a-0123456789" not in repr(table)


def test_a_key_may_be_listed_by_its_digest_and_no_error_prints_a_key():
    """A Secret of digests holds nothing a reader could call with; the key still works."""
    table = parse_tenants(f"version: v1\ntenants: [{{name: a, keys: ['sha256:{DIGEST}']}}]")
    tenant = table.tenant("k123456789abcdefg")
    assert tenant is not None and tenant.name == "a"
    assert table.tenant(f"sha256:{DIGEST}") is None  # the digest is no key
    with pytest.raises(ContractError) as caught:
        parse_tenants("version: v1\ntenants: [{name: a, keys: [k123456789abcdefg]}, "
                      "{name: b, keys: [k123456789abcdefg]}]")  # fmt: skip
    assert "k123456789abcdefg" not in str(caught.value)
