"""The pod GPU assignment annotation: written by the extender, marked by the device plugin."""

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infergrid.assignment_annotation import (
    AssignedGpu,
    AssignedMig,
    ContainerAssignment,
    PodAssignment,
    decode_assignment,
    encode_assignment,
    mark_allocated,
)
from infergrid.errors import ContractError

names = st.text(min_size=1, max_size=12)
gpu_lists = st.lists(
    st.builds(AssignedGpu, uuid=names, memory_mib=st.integers(1, 2**40), cores=st.integers(0, 100)),
    min_size=1,
    max_size=4,
    unique_by=lambda g: g.uuid,
)
migs = st.builds(AssignedMig, uuid=names, profile=names, gpu_uuid=names)


@st.composite
def assignments(draw: st.DrawFn) -> PodAssignment:
    container_names = draw(st.lists(names, unique=True, max_size=4))
    containers = tuple(
        ContainerAssignment(
            name,
            gpus=(gpus := tuple(draw(gpu_lists))),
            allocated=draw(st.booleans()),
            shared=len(gpus) == 1 and draw(st.booleans()),
        )
        if draw(st.booleans())
        else ContainerAssignment(name, mig=draw(migs), allocated=draw(st.booleans()))
        for name in container_names
    )
    assigned_at = draw(st.datetimes(timezones=st.just(UTC)))
    return PodAssignment(node=draw(names), assigned_at=assigned_at, containers=containers)


@given(assignments())
def test_encode_then_decode_gives_the_same_assignment(assignment):
    assert decode_assignment(encode_assignment(assignment)) == assignment


ASSIGNMENT = PodAssignment(
    "node-a",
    datetime(2025, 3, 1, 12, 0, tzinfo=UTC),
    (
        ContainerAssignment("engine", gpus=(AssignedGpu("GPU-0", 8192, 50),), shared=True),
        ContainerAssignment("sidecar", mig=AssignedMig("MIG-0", "1g.10gb", "GPU-1")),
    ),
)


def test_the_document_carries_node_time_and_containers():
    doc = json.loads(encode_assignment(ASSIGNMENT))
    assert doc["version"] == "v1"
    assert doc["assignedAt"] == "2025-03-01T12:00:00Z"
    assert doc["containers"][0] == {
        "name": "engine",
        "allocated": False,
        "shared": True,
        "gpus": [{"uuid": "GPU-0", "memoryMiB": 8192, "cores": 50}],
    }
    assert [c.kind for c in ASSIGNMENT.containers] == ["share", "mig"]
    assert doc["containers"][1]["mig"] == {
        "uuid": "MIG-0",
        "profile": "1g.10gb",
        "gpuUuid": "GPU-1",
    }


def test_mark_allocated_returns_a_new_assignment_with_only_that_container_marked():
    marked = mark_allocated(ASSIGNMENT, "sidecar")
    assert [c.allocated for c in marked.containers] == [False, True]
    assert [c.allocated for c in ASSIGNMENT.containers] == [False, False]
    assert mark_allocated(marked, "sidecar") == marked


def test_mark_allocated_names_an_unknown_container():
    with pytest.raises(ContractError, match="'nope'") as raised:
        mark_allocated(ASSIGNMENT, "nope")
    assert raised.value.field == "containers"


def test_an_explicit_null_mig_is_read_as_absent():
    doc = json.loads(encode_assignment(ASSIGNMENT))
    doc["containers"][0]["mig"] = None
    assert decode_assignment(json.dumps(doc)) == ASSIGNMENT


BAD_DOCS = [
    ("missing version", lambda d: d.pop("version"), "version"),
    ("missing node", lambda d: d.pop("node"), "node"),
    ("missing time", lambda d: d.pop("assignedAt"), "assignedAt"),
    ("naive time", lambda d: d.update(assignedAt="2025-03-01T12:00:00"), "assignedAt"),
    ("containers not a list", lambda d: d.update(containers="engine"), "containers"),
    ("missing name", lambda d: d["containers"][0].pop("name"), "containers[0].name"),
    ("duplicate name", lambda d: d["containers"][1].update(name="engine"), "containers[1].name"),
    ("missing allocated", lambda d: d["containers"][0].pop("allocated"), "containers[0].allocated"),
    (
        "allocated as string",
        lambda d: d["containers"][0].update(allocated="yes"),
        "containers[0].allocated",
    ),
    ("neither gpus nor mig", lambda d: d["containers"][0].update(gpus=[]), "containers[0]"),
    (
        "both gpus and mig",
        lambda d: d["containers"][1].update(gpus=d["containers"][0]["gpus"]),
        "containers[1]",
    ),
    ("missing gpus", lambda d: d["containers"][1].pop("gpus"), "containers[1].gpus"),
    ("missing shared", lambda d: d["containers"][0].pop("shared"), "containers[0].shared"),
    (
        "a share of two GPUs",
        lambda d: d["containers"][0]["gpus"].append({"uuid": "GPU-9", "memoryMiB": 1, "cores": 1}),
        "containers[0].shared",
    ),
    (
        "memory zero",
        lambda d: d["containers"][0]["gpus"][0].update(memoryMiB=0),
        "containers[0].gpus[0].memoryMiB",
    ),
    (
        "cores negative",
        lambda d: d["containers"][0]["gpus"][0].update(cores=-1),
        "containers[0].gpus[0].cores",
    ),
    (
        "cores above 100",
        lambda d: d["containers"][0]["gpus"][0].update(cores=101),
        "containers[0].gpus[0].cores",
    ),
    (
        "duplicate gpu",
        lambda d: d["containers"][0]["gpus"].append(d["containers"][0]["gpus"][0]),
        "containers[0].gpus[1].uuid",
    ),
    ("mig not an object", lambda d: d["containers"][1].update(mig="MIG-0"), "containers[1].mig"),
    (
        "mig without gpu uuid",
        lambda d: d["containers"][1]["mig"].pop("gpuUuid"),
        "containers[1].mig.gpuUuid",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "field"), [c[1:] for c in BAD_DOCS], ids=[c[0] for c in BAD_DOCS]
)
def test_bad_documents_are_refused_naming_the_field(mutate, field):
    doc = json.loads(encode_assignment(ASSIGNMENT))
    mutate(doc)
    with pytest.raises(ContractError) as raised:
        decode_assignment(json.dumps(doc))
    assert raised.value.field == field


@pytest.mark.parametrize("text", ["", "{", "[]"])
def test_text_that_is_not_a_json_object_is_refused(text):
    with pytest.raises(ContractError) as raised:
        decode_assignment(text)
    assert raised.value.field == "infergrid.io/gpu-assignment"
