"""Reading the usage an engine reports from its answer as the answer passes."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from gateway.reported_usage import EVENT_BYTES, StreamUsage, Tail, usage_in_tail
from tests.gateway.fake_pods import usage

DELTA = b'data: {"choices": [{"delta": {"content": "\\"usage\\": 3"}}]}\n\n'
USAGE = b"data: " + orjson.dumps({"choices": [], "usage": usage(7, 35)}) + b"\n\n"
STREAM = DELTA * 3 + USAGE + b"data: [DONE]\n\n"


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


def relay(usage_reader: StreamUsage, chunks: list[bytes]) -> bytes:
    return b"".join(usage_reader.feed(c) for c in chunks) + usage_reader.rest()


@given(st.lists(st.integers(min_value=0), max_size=12), st.booleans())
def test_however_a_stream_is_cut_its_usage_is_read_and_only_the_usage_chunk_is_hidden(cuts, hide):
    reader = StreamUsage(hide)
    sent = relay(reader, split(STREAM, cuts))
    assert reader.used == 42
    assert sent == (STREAM.replace(USAGE, b"") if hide else STREAM)


def test_a_stream_without_a_usage_chunk_reports_none_and_passes_whole():
    reader = StreamUsage(hide=True)
    assert relay(reader, [DELTA, DELTA[:10]]) == DELTA + DELTA[:10]
    assert reader.used is None


def test_an_event_longer_than_any_usage_chunk_is_sent_on_unread_as_it_comes():
    reader = StreamUsage(hide=True)
    long = b"data: " + b"x" * EVENT_BYTES
    assert reader.feed(long) == long  # not held back until the event ends
    assert relay(reader, [b"yy\n\n", USAGE]) == b"yy\n\n"
    assert reader.used == 42


def test_a_whole_answers_usage_is_its_last_usage_key_not_one_inside_its_text():
    answer = orjson.dumps({"choices": [{"text": '"usage": {"total_tokens": 1}'}],
                           "usage": {"prompt_tokens": 2, "total_tokens": 9}})  # fmt: skip
    assert usage_in_tail(answer) == 9
    assert usage_in_tail(answer[answer.rindex(b'"usage"') :]) == 9
    assert usage_in_tail(b'{"choices": []}') is None


def test_a_tail_keeps_the_last_bytes_only():
    tail = Tail(limit=10)
    for chunk in (b"a" * 7, b"b" * 7, b"c" * 2):
        tail.add(chunk)
    assert tail.bytes() == b"a" + b"b" * 7 + b"cc"
    tail.add(b"d" * 10)
    assert (tail.bytes(), len(tail.chunks)) == (b"d" * 10, 1)
