"""OpenAI-style bodies: what is accepted, and a 400 naming the field for everything else."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batching_engine.sequence import SamplingParams
from batching_engine.server.json_fields import RequestError
from batching_engine.server.protocol import (
    ChatMessage,
    GenerationRequest,
    decode_json,
    parse_chat,
    parse_completion,
    parse_embedding,
)

PARSERS = (parse_completion, parse_chat, parse_embedding)


def error_field(parse: Any, body: object) -> str:
    with pytest.raises(RequestError) as err:
        parse(body)
    return err.value.field


def test_a_minimal_completion_takes_the_default_sampling_settings() -> None:
    req = parse_completion({"prompt": "hello"})
    assert req == GenerationRequest(model=None, prompt="hello", params=SamplingParams())


def test_a_full_completion_body_is_read_into_sampling_params() -> None:
    req = parse_completion(
        {
            "model": "tiny",
            "prompt": [1, 2, 3],
            "max_tokens": 7,
            "temperature": 0,
            "top_p": 0.5,
            "top_k": 3,
            "stop": ["\n", "."],
            "seed": 42,
            "stream": True,
            "stream_options": {"include_usage": True},
            "priority": -2,
            "user": "u-1",
            "n": 1,
        }
    )
    assert req.model == "tiny" and req.prompt == [1, 2, 3]
    assert req.params == SamplingParams(
        temperature=0.0, top_p=0.5, top_k=3, max_tokens=7, stop=("\n", "."), seed=42
    )
    assert req.stream and req.include_usage and req.priority == -2


def test_unknown_fields_and_nulls_are_ignored_like_openai_does() -> None:
    req = parse_completion({"prompt": "x", "service_tier": "auto", "temperature": None})
    assert req.params.temperature == SamplingParams().temperature


def test_a_single_stop_string_and_a_one_element_prompt_list_are_unwrapped() -> None:
    req = parse_completion({"prompt": ["hi"], "stop": "END"})
    assert req.prompt == "hi" and req.params.stop == ("END",)
    assert parse_completion({"prompt": [[5, 6]]}).prompt == [5, 6]


@pytest.mark.parametrize(
    "neutral",
    [{"logprobs": False}, {"logprobs": None}, {"echo": False}, {"best_of": 1},
     {"presence_penalty": 0.0}, {"frequency_penalty": 0}, {"logit_bias": {}},
     {"response_format": {"type": "text"}}, {"tool_choice": "none"}],
)  # fmt: skip
def test_unsupported_features_are_accepted_when_they_ask_for_nothing(neutral: dict) -> None:
    parse_completion({"prompt": "x", **neutral})


@pytest.mark.parametrize(
    "asked",
    [{"logprobs": 5}, {"logprobs": True}, {"echo": True}, {"best_of": 3}, {"suffix": "end"},
     {"presence_penalty": 0.5}, {"logit_bias": {"50256": -100}}, {"tools": [{"type": "function"}]},
     {"response_format": {"type": "json_object"}}, {"best_of": True}],
)  # fmt: skip
def test_unsupported_features_that_ask_for_something_are_refused_by_name(asked: dict) -> None:
    assert error_field(parse_completion, {"prompt": "x", **asked}) == next(iter(asked))


def test_top_k_minus_one_means_off() -> None:
    assert parse_completion({"prompt": "x", "top_k": -1}).params.top_k == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [1, -1]}, "prompt[1]"),
        ({"prompt": [1, True]}, "prompt[1]"),
        ({"prompt": "x", "model": 3}, "model"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": "10"}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 1.5}, "max_tokens"),
        ({"prompt": "x", "temperature": 2.5}, "temperature"),
        ({"prompt": "x", "temperature": True}, "temperature"),
        ({"prompt": "x", "temperature": 10**400}, "temperature"),
        ({"prompt": "x", "temperature": -0.5}, "temperature"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({"prompt": "x", "top_p": 1.5}, "top_p"),
        ({"prompt": "x", "top_k": -2}, "top_k"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": "x", "stop": ["a", 1]}, "stop[1]"),
        ({"prompt": "x", "stop": ""}, "stop"),
        ({"prompt": "x", "stop": "s" * 1001}, "stop"),
        ({"prompt": "x", "stop": ["ok", "s" * 1001]}, "stop[1]"),
        ({"prompt": "x", "seed": -1}, "seed"),
        ({"prompt": "x", "n": 2}, "n"),
        ({"prompt": "x", "stream": "yes"}, "stream"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
        (
            {"prompt": "x", "stream": True, "stream_options": {"include_usage": 1}},
            "stream_options.include_usage",
        ),
        ({"prompt": "x", "priority": 0.5}, "priority"),
        ([1, 2], "body"),
    ],
)
def test_a_bad_completion_field_is_named(body: object, field: str) -> None:
    assert error_field(parse_completion, body) == field


def test_chat_messages_are_read_with_text_parts_joined() -> None:
    req = parse_chat(
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": None},
            ],
            "max_completion_tokens": 5,
        }
    )
    assert req.messages == (
        ChatMessage("system", "be brief"),
        ChatMessage("user", "ab"),
        ChatMessage("assistant", ""),
    )
    assert req.params.max_tokens == 5 and req.prompt is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content[0].text",
        ),
        ({"messages": [{"role": "user", "content": "x"}, 7]}, "messages[1]"),
        ({"messages": [{"role": "user", "content": "x"}], "top_p": 1.5}, "top_p"),
    ],
)
def test_a_bad_chat_field_is_named(body: object, field: str) -> None:
    assert error_field(parse_chat, body) == field


def test_embedding_inputs_are_a_string_a_token_list_or_a_list_of_either() -> None:
    assert parse_embedding({"input": "a"}).inputs == ("a",)
    assert parse_embedding({"input": [1, 2]}).inputs == ([1, 2],)
    assert parse_embedding({"input": ["a", [3]]}).inputs == ("a", [3])
    assert parse_embedding({"input": "a", "encoding_format": "base64"}).encoding_format == "base64"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": ["a", 3.5]}, "input[1]"),
        ({"input": ["a", []]}, "input[1]"),
        ({"input": ["a"] * 3000}, "input"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "dimensions": 8}, "dimensions"),
    ],
)
def test_a_bad_embedding_field_is_named(body: object, field: str) -> None:
    assert error_field(parse_embedding, body) == field


LONE = "a \ud800 b"  # valid JSON ("\\ud800"), not text


@pytest.mark.parametrize(
    ("parse", "body", "field"),
    [
        (parse_completion, {"prompt": LONE}, "prompt"),
        (parse_completion, {"prompt": [LONE]}, "prompt[0]"),
        (parse_completion, {"prompt": "x", "stop": ["ok", LONE]}, "stop[1]"),
        (parse_chat, {"messages": [{"role": "user", "content": LONE}]}, "messages[0].content"),
        (parse_chat, {"messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]},
         "messages[0].content[0].text"),
        (parse_embedding, {"input": ["a", "\udfff"]}, "input[1]"),
    ],
)  # fmt: skip
def test_a_lone_surrogate_is_refused_naming_its_field(parse: Any, body: object, field: str) -> None:
    with pytest.raises(RequestError) as err:
        parse(body)
    assert err.value.field == field
    assert "lone surrogate U+D" in str(err.value)


def test_a_surrogate_pair_escaped_in_json_is_one_character_and_accepted() -> None:
    doc = decode_json(b'{"prompt": "\\ud83d\\ude00 \xc3\xa9 \\u202e\\u0000"}')
    assert parse_completion(doc).prompt == "\U0001f600 \xe9 \u202e\x00"


@pytest.mark.parametrize(
    "raw", [b"", b"{", b"[1]", b'"x"', b'{"prompt": NaN}', b"\xff\xfe", b"[" * 100_000]
)
def test_a_body_that_is_not_a_json_object_is_named_body(raw: bytes) -> None:
    assert error_field(decode_json, raw) == "body"


def test_a_json_object_is_decoded() -> None:
    assert decode_json(b'{"prompt": "x"}') == {"prompt": "x"}


# Fuzz: any JSON value gets a parsed request or a RequestError, never another exception.

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = (
    "model",
    "prompt",
    "messages",
    "input",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "n",
    "priority",
    "user",
    "encoding_format",
    "dimensions",
    "ignore_eos",
)
VALID = {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}], "input": "hi"}
bodies = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6).map(
    lambda extra: {**VALID, **extra}
)


def parses_or_names_a_field(parse: Any, body: object) -> None:
    try:
        parse(body)
    except RequestError as err:
        assert err.field and err.message.startswith(err.field)


@settings(max_examples=300, deadline=None)
@given(body=bodies, which=st.sampled_from(PARSERS))
def test_any_body_of_known_fields_parses_or_gets_a_named_error(body: object, which: Any) -> None:
    parses_or_names_a_field(which, body)


@settings(max_examples=200, deadline=None)
@given(value=json_values, which=st.sampled_from(PARSERS))
def test_any_json_value_parses_or_gets_a_named_error(value: object, which: Any) -> None:
    parses_or_names_a_field(which, value)


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=40) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_decode_or_get_a_body_error(raw: bytes) -> None:
    try:
        decode_json(raw)
    except RequestError as err:
        assert err.field == "body"
