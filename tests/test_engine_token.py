"""The engine token: one derivation for the operator (which writes it) and the gateway
(which sends it), one constant-time comparison for the engine, one reader for the key."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import GatewayConfig
from inference_operator.config import OperatorConfig
from infergrid.engine_token import MIN_KEY_BYTES, derive, matches, read_key, with_key
from infergrid.errors import ContractError

KEY = bytes(range(32))
LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)


def test_the_token_is_hmac_sha256_of_the_key_over_namespace_slash_name() -> None:
    expected = hmac.new(KEY, b"team-a/chat", hashlib.sha256).hexdigest()
    assert derive(KEY, "team-a", "chat") == expected


@given(LABEL, LABEL, LABEL, LABEL)
def test_two_services_never_share_a_token(ns1: str, name1: str, ns2: str, name2: str) -> None:
    same = (ns1, name1) == (ns2, name2)
    assert (derive(KEY, ns1, name1) == derive(KEY, ns2, name2)) == same


@given(LABEL, LABEL)
def test_another_key_gives_another_token(namespace: str, name: str) -> None:
    assert derive(KEY, namespace, name) != derive(KEY[::-1], namespace, name)


def test_no_token_is_derived_without_a_key() -> None:
    with pytest.raises(ValueError):
        derive(b"", "team-a", "chat")


@given(st.text(max_size=80), st.one_of(st.none(), st.text(max_size=80)))
def test_only_the_token_itself_matches(expected: str, presented: str | None) -> None:
    assert matches(expected, presented) == (presented == expected)


def test_the_key_file_is_read_with_surrounding_whitespace_dropped(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_bytes(b"  " + b"x" * MIN_KEY_BYTES + b"\n")
    assert read_key(str(path)) == b"x" * 32


def test_an_empty_name_means_no_key() -> None:
    assert read_key("") == b""


@pytest.mark.parametrize("content", [None, b"short", b" " * 64])
def test_a_missing_or_short_key_is_refused_naming_the_setting(
    tmp_path: Path, content: bytes | None
) -> None:
    path = tmp_path / "key"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ContractError) as err:
        read_key(str(path))
    assert err.value.field == "engineTokenKeyFile"


def test_the_settings_hold_the_keys_path_and_the_key_is_read_in_at_start(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_bytes(KEY)
    for cfg in (GatewayConfig(engine_token_key_file=str(path)),
                OperatorConfig(engine_token_key_file=str(path))):  # fmt: skip
        loaded = with_key(cfg)
        assert loaded.engine_token_key == KEY
        assert KEY not in repr(loaded).encode() and str(list(KEY)) not in repr(loaded)
