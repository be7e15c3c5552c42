"""What the gateway reads of a body, and how it refuses a bad one, naming the field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.request_body import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MESSAGE_TOKENS,
    PROMPT_TOKENS,
    forwarded_body,
    parse_request,
    reservation,
)
from infergrid.errors import ContractError


def parse(body, endpoint=CHAT):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(raw, endpoint)


def test_a_chat_request_gives_its_model_stream_prefix_and_bounds():
    req = parse({"model": "m", "stream": True, "max_tokens": 10,
                 "messages": [{"role": "user", "content": "x" * 40}]})  # fmt: skip
    assert (req.model, req.stream, req.usage_asked) == ("m", True, False)
    assert req.prefix_text.startswith("user\x00xxxx")
    assert req.prompt_tokens == PROMPT_TOKENS + MESSAGE_TOKENS + 4 + 40  # role and content
    assert (req.max_tokens, req.copies) == (10, 1)


def test_text_counts_its_utf8_bytes_and_token_ids_one_each():
    text = parse({"model": "m", "prompt": "é漢"}, COMPLETIONS)  # 2 + 3 bytes
    ids = parse({"model": "m", "prompt": [7] * 1000}, COMPLETIONS)
    nested = parse({"model": "m", "prompt": [[7] * 1000]}, COMPLETIONS)
    assert text.prompt_tokens == PROMPT_TOKENS + 5
    assert ids.prompt_tokens == PROMPT_TOKENS + 1000
    assert nested.prompt_tokens == PROMPT_TOKENS + MESSAGE_TOKENS + 1000


def test_content_parts_and_n_copies_count():
    parts = [{"type": "text", "text": "hi"}, {"type": "text", "text": 5}]
    req = parse({"model": "m", "n": 3, "max_completion_tokens": 5,
                 "messages": [{"role": "user", "content": parts}]})  # fmt: skip
    assert "hi" in req.prefix_text
    assert req.prompt_tokens == PROMPT_TOKENS + MESSAGE_TOKENS + 4 + 2
    assert (req.max_tokens, req.copies) == (5, 3)


def test_the_reservation_is_the_prompt_plus_every_answer_or_the_whole_context():
    req = parse({"model": "m", "n": 2, "max_tokens": 100, "prompt": "x" * 36}, COMPLETIONS)
    assert reservation(req, context_tokens=None, default_answer=256) == 100 + 2 * 100
    assert reservation(req, context_tokens=4096, default_answer=256) == 100 + 2 * 100
    assert reservation(req, context_tokens=120, default_answer=256) == 2 * 120
    open_ended = parse({"model": "m", "prompt": "x" * 36}, COMPLETIONS)
    assert reservation(open_ended, context_tokens=2048, default_answer=256) == 2048
    assert reservation(open_ended, context_tokens=None, default_answer=256) == 100 + 256


def test_embeddings_reserve_their_inputs_only():
    req = parse({"model": "e", "input": ["abcd", "efgh"]}, EMBEDDINGS)
    assert (req.prefix_text, req.copies, req.max_tokens) == ("", 0, None)
    assert reservation(req, context_tokens=512, default_answer=256) == (
        PROMPT_TOKENS + 2 * (MESSAGE_TOKENS + 4)
    )


def test_a_stream_asks_the_engine_for_its_usage_and_nothing_else_changes():
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "}"}]}
    raw = json.dumps(body).encode() + b"\n"
    sent = json.loads(forwarded_body(raw, parse(raw)))
    assert sent == {**body, "stream_options": {"include_usage": True}}
    declined = {**body, "stream_options": {"include_usage": False}}
    raw = json.dumps(declined).encode()
    assert json.loads(forwarded_body(raw, parse(raw)))["stream_options"]["include_usage"]


def test_a_body_that_needs_no_usage_asked_is_forwarded_byte_for_byte():
    asked = json.dumps({"model": "m", "stream": True, "messages": [],
                        "stream_options": {"include_usage": True}}).encode()  # fmt: skip
    whole = json.dumps({"model": "m", "messages": []}).encode()
    assert parse(asked).usage_asked
    assert forwarded_body(asked, parse(asked)) is asked
    assert forwarded_body(whole, parse(whole)) is whole


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
        # A name no field could have is named `body`, shown cut short (found by the fuzzer).
        ({"model": "m", "messages": [], "": 1}, CHAT, "body", 'holds a field "", unknown'),
        ({"model": "m", "messages": [], "[": 1}, CHAT, "body", 'holds a field "[", unknown'),
        ({"model": "m", "prompt": "x", "\ud800": 1}, COMPLETIONS, "body", '"\\ud800"'),
        ({"model": "m", "prompt": "x", "k" * 10**6: 1}, COMPLETIONS, "body", f'"{"k" * 64}"...'),
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


@given(
    st.lists(st.tuples(st.sampled_from(["user", "system", "assistant"]), st.text()),
             min_size=1, max_size=5),
    st.one_of(st.none(), st.integers(min_value=1, max_value=5000)),
    st.integers(min_value=1, max_value=4),
    st.one_of(st.none(), st.integers(min_value=16, max_value=8192)),
    st.data(),
)  # fmt: skip
def test_the_reservation_bounds_what_an_engine_that_respects_max_tokens_can_report(
    messages, max_tokens, n, context, data
):
    """An engine whose tokenizer spends at most a token per UTF-8 byte and whose template
    adds at most MESSAGE_TOKENS a message and PROMPT_TOKENS a prompt, and which stops each
    answer at max_tokens or a full context."""
    body = {"model": "m", "n": n, "messages": [{"role": r, "content": c} for r, c in messages]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    req = parse(body)
    text = sum(len(r.encode()) + len(c.encode("utf-8", "surrogatepass")) for r, c in messages)
    bound = text + MESSAGE_TOKENS * len(messages) + PROMPT_TOKENS
    limit = context if context is not None else 10**9
    prompt = data.draw(st.integers(min_value=1, max_value=min(bound, limit)))
    room = limit - prompt
    cap = room if max_tokens is None else min(max_tokens, room)
    if context is None and max_tokens is None:
        cap = min(cap, 256)  # the engine's own default, as the gateway is told it
    answers = data.draw(st.lists(st.integers(min_value=0, max_value=cap), min_size=n, max_size=n))
    assert reservation(req, context, default_answer=256) >= prompt + sum(answers)
