"""Typed field readers: every decoder reports bad input through these, by full path."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from infergrid.codec import (
    check_version,
    decode_time,
    dump_document,
    each,
    encode_time,
    expect,
    field,
    integer,
    join,
    load_document,
    reject_unknown,
    unique,
)
from infergrid.errors import ContractError


@pytest.mark.parametrize(
    ("path", "key", "joined"),
    [
        ("", "gpus", "gpus"),
        ("gpus", 2, "gpus[2]"),
        ("gpus[2]", "memoryMiB", "gpus[2].memoryMiB"),
        ("limits", "infergrid.io/gpu-memory", "limits[infergrid.io/gpu-memory]"),
    ],
)
def test_join_uses_dots_for_names_and_brackets_for_the_rest(path, key, joined):
    assert join(path, key) == joined


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (True, int),
        (False, int),
        (1.0, int),
        ("1", int),
        (1, str),
        (None, str),
        ([], dict),
        (0, bool),
    ],
)
def test_expect_rejects_the_wrong_type_including_booleans_as_integers(value, kind):
    with pytest.raises(ContractError) as raised:
        expect(value, kind, "a.b")
    assert raised.value.field == "a.b"
    assert "expected" in raised.value.reason


def test_expect_rejects_empty_strings():
    with pytest.raises(ContractError, match="must not be empty"):
        expect("", str, "name")


def test_field_names_a_missing_key_by_its_full_path():
    with pytest.raises(ContractError) as raised:
        field({}, "memoryMiB", int, "gpus[2]")
    assert raised.value.field == "gpus[2].memoryMiB"
    assert raised.value.reason == "is required"


def test_field_gives_the_default_for_absent_or_null_keys_only():
    assert field({}, "n", int, default=7) == 7
    assert field({"n": None}, "n", int, default=7) == 7
    assert field({"n": 3}, "n", int, default=7) == 3
    with pytest.raises(ContractError):
        field({"n": None}, "n", int)


def test_integer_checks_bounds():
    assert integer({"n": 100}, "n", low=1, high=100) == 100
    for bad in (0, 101):
        with pytest.raises(ContractError, match="from 1 to 100") as raised:
            integer({"n": bad}, "n", "x", low=1, high=100)
        assert raised.value.field == "x.n"
    with pytest.raises(ContractError, match="at least 0"):
        integer({"n": -1}, "n")


def test_each_pairs_items_with_their_paths_and_checks_their_type():
    assert each({"l": [{"a": 1}]}, "l", dict, "doc") == [({"a": 1}, "doc.l[0]")]
    with pytest.raises(ContractError) as raised:
        each({"l": [{}, 3]}, "l", dict)
    assert raised.value.field == "l[1]"


def test_unique_fails_at_the_second_occurrence():
    with pytest.raises(ContractError) as raised:
        unique([(1, "a[0]"), (2, "a[1]"), (1, "a[2]")], "index")
    assert raised.value.field == "a[2]"


def test_reject_unknown_names_the_unknown_key():
    reject_unknown({"a": 1}, ("a", "b"))
    with pytest.raises(ContractError) as raised:
        reject_unknown({"a": 1, "nmae": 2}, ("a", "name"), "nodes[0]")
    assert raised.value.field == "nodes[0].nmae"


@pytest.mark.parametrize("doc", [{}, {"version": "v2"}, {"version": 1}])
def test_check_version_refuses_missing_or_unknown_versions(doc):
    with pytest.raises(ContractError) as raised:
        check_version(doc)
    assert raised.value.field == "version"


@pytest.mark.parametrize("text", ["", "{", "[1]", "null", "[" * 100_000])
def test_load_document_reports_bad_json_against_the_document_name(text):
    with pytest.raises(ContractError) as raised:
        load_document(text, "infergrid.io/gpu-usage")
    assert raised.value.field == "infergrid.io/gpu-usage"


def test_dump_document_is_compact_sorted_and_versioned():
    assert dump_document({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1,"version":"v1"}'


def test_times_are_utc_with_z_and_come_back_equal():
    moment = datetime(2025, 3, 1, 12, 30, 5, 123456, tzinfo=UTC)
    assert encode_time(moment, "t") == "2025-03-01T12:30:05.123456Z"
    assert decode_time({"t": "2025-03-01T12:30:05.123456Z"}, "t") == moment


def test_times_with_an_offset_are_converted_to_utc():
    moment = datetime(2025, 3, 1, 14, 30, tzinfo=timezone(timedelta(hours=2)))
    assert encode_time(moment, "t") == "2025-03-01T12:30:00Z"
    decoded = decode_time({"t": "2025-03-01T14:30:00+02:00"}, "t")
    assert decoded == moment
    assert decoded.tzinfo == UTC


def test_naive_times_are_refused_both_ways():
    with pytest.raises(ContractError) as raised:
        encode_time(datetime(2025, 3, 1), "heartbeat")
    assert raised.value.field == "heartbeat"
    with pytest.raises(ContractError, match="no timezone"):
        decode_time({"t": "2025-03-01T12:00:00"}, "t")


@pytest.mark.parametrize("text", ["yesterday", "2025-13-01T00:00:00Z", "12:00"])
def test_unparsable_times_are_refused(text):
    with pytest.raises(ContractError) as raised:
        decode_time({"heartbeat": text}, "heartbeat")
    assert raised.value.field == "heartbeat"
