"""What the gateway reads of a body, and how it refuses a bad one, naming the field."""

from __future__ import annotations

import json

import pytest

from gateway.request_body import CHAT, COMPLETIONS, EMBEDDINGS, parse_request
from infergrid.errors import ContractError


def parse(body, endpoint=CHAT):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(raw, endpoint, default_max_tokens=256)


def test_a_chat_request_gives_its_model_stream_prefix_and_estimate():
    req = parse({"model": "m", "stream": True, "max_tokens": 10,
                 "messages": [{"role": "user", "content": "x" * 40}]})  # fmt: skip
    assert (req.model, req.stream) == ("m", True)
    assert req.prefix_text.startswith("user\x00xxxx")
    assert req.estimate == 12 + 10  # (4 + 1 + 40 + 1) chars / 4, rounded up, plus max_tokens


def test_content_parts_and_n_copies_count():
    parts = [{"type": "text", "text": "hi"}]
    req = parse({"model": "m", "n": 3, "max_completion_tokens": 5,
                 "messages": [{"role": "user", "content": parts}]})  # fmt: skip
    assert "hi" in req.prefix_text and req.estimate == 2 + 15


def test_without_max_tokens_the_default_is_charged():
    assert parse({"model": "m", "prompt": "abcd"}, COMPLETIONS).estimate == 1 + 256


def test_embeddings_have_no_prefix_and_charge_the_input_only():
    req = parse({"model": "e", "input": ["abcd", "efgh"]}, EMBEDDINGS)
    assert (req.prefix_text, req.estimate) == ("", 2)


@pytest.mark.parametrize(
    ("body", "endpoint", "field", "reason"),
    [
        (b"{not json", CHAT, "body", "not valid JSON"),
        (b"[1, 2]", CHAT, "body", "expected a JSON object, got array"),
        (b'{"model": "m", "temperature": NaN}', CHAT, "body", "not valid JSON"),
        ({"messages": []}, CHAT, "model", "is required"),
        ({"model": 7, "messages": []}, CHAT, "model", "is required"),
        ({"model": "m", "messages": [], "max_token": 5}, CHAT, "max_token", "unknown field"),
        ({"model": "m", "prompt": "x", "messages": []}, COMPLETIONS, "messages", "unknown field"),
        ({"model": "m", "input": "x", "stream": True}, EMBEDDINGS, "stream", "unknown field"),
        ({"model": "m", "messages": [], "stream": "yes"}, CHAT, "stream", "expected true or false"),
    ],
)
def test_a_bad_body_is_refused_naming_the_field(body, endpoint, field, reason):
    with pytest.raises(ContractError) as caught:
        parse(body, endpoint)
    assert caught.value.field == field and reason in caught.value.reason


def test_unicode_edge_cases_are_valid_text():
    req = parse('{"model": "m", "messages": [{"role": "user", "content": "\\ud800\\u0000é"}]}'
                .encode())  # fmt: skip
    assert "é" in req.prefix_text


def test_the_engines_own_extensions_are_known_fields():
    parse({"model": "m", "prompt": "x", "top_k": 5, "ignore_eos": True, "priority": 1},
          COMPLETIONS)  # fmt: skip
