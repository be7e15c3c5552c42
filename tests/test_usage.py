"""The node GPU usage annotation: measured memory and utilisation, and a heartbeat."""

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infergrid.errors import ContractError
from infergrid.usage import GpuUsage, GpuUsageSample, decode_usage, encode_usage

names = st.text(min_size=1, max_size=12)


@st.composite
def usages(draw: st.DrawFn) -> GpuUsage:
    uuids = draw(st.lists(names, unique=True, max_size=5))
    samples = tuple(
        GpuUsageSample(uuid, draw(st.integers(0, 2**40)), draw(st.integers(0, 100)))
        for uuid in uuids
    )
    heartbeat = draw(st.datetimes(timezones=st.just(UTC)))
    return GpuUsage(node=draw(names), heartbeat=heartbeat, gpus=samples)


@given(usages())
def test_encode_then_decode_gives_the_same_usage(usage):
    assert decode_usage(encode_usage(usage)) == usage


USAGE = GpuUsage(
    "node-a",
    datetime(2025, 3, 1, 12, 0, 5, tzinfo=UTC),
    (GpuUsageSample("GPU-0", 1024, 50), GpuUsageSample("GPU-1", 0, 0)),
)


def test_heartbeat_is_rfc3339_utc():
    doc = json.loads(encode_usage(USAGE))
    assert doc["heartbeat"] == "2025-03-01T12:00:05Z"
    assert doc["gpus"][0] == {"uuid": "GPU-0", "usedMiB": 1024, "utilizationPercent": 50}


def test_a_naive_heartbeat_cannot_be_encoded():
    naive = GpuUsage("n", datetime(2025, 3, 1), ())
    with pytest.raises(ContractError) as raised:
        encode_usage(naive)
    assert raised.value.field == "heartbeat"


BAD_DOCS = [
    ("missing version", lambda d: d.pop("version"), "version"),
    ("unknown version", lambda d: d.update(version="v0"), "version"),
    ("missing node", lambda d: d.pop("node"), "node"),
    ("missing heartbeat", lambda d: d.pop("heartbeat"), "heartbeat"),
    ("naive heartbeat", lambda d: d.update(heartbeat="2025-03-01T12:00:05"), "heartbeat"),
    ("unparsable heartbeat", lambda d: d.update(heartbeat="soon"), "heartbeat"),
    ("heartbeat as number", lambda d: d.update(heartbeat=1740830405), "heartbeat"),
    ("missing gpus", lambda d: d.pop("gpus"), "gpus"),
    ("missing uuid", lambda d: d["gpus"][1].pop("uuid"), "gpus[1].uuid"),
    ("duplicate uuid", lambda d: d["gpus"][1].update(uuid="GPU-0"), "gpus[1].uuid"),
    ("negative used memory", lambda d: d["gpus"][0].update(usedMiB=-1), "gpus[0].usedMiB"),
    (
        "utilization above 100",
        lambda d: d["gpus"][0].update(utilizationPercent=101),
        "gpus[0].utilizationPercent",
    ),
    (
        "utilization below 0",
        lambda d: d["gpus"][0].update(utilizationPercent=-1),
        "gpus[0].utilizationPercent",
    ),
    (
        "utilization as float",
        lambda d: d["gpus"][0].update(utilizationPercent=50.5),
        "gpus[0].utilizationPercent",
    ),
    (
        "utilization as boolean",
        lambda d: d["gpus"][0].update(utilizationPercent=True),
        "gpus[0].utilizationPercent",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "field"), [c[1:] for c in BAD_DOCS], ids=[c[0] for c in BAD_DOCS]
)
def test_bad_documents_are_refused_naming_the_field(mutate, field):
    doc = json.loads(encode_usage(USAGE))
    mutate(doc)
    with pytest.raises(ContractError) as raised:
        decode_usage(json.dumps(doc))
    assert raised.value.field == field


@pytest.mark.parametrize("text", ["", "{", "[]"])
def test_text_that_is_not_a_json_object_is_refused(text):
    with pytest.raises(ContractError) as raised:
        decode_usage(text)
    assert raised.value.field == "infergrid.io/gpu-usage"
