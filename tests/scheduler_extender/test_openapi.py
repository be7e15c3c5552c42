"""The extender's OpenAPI document cannot drift from its readers or its routes.

Every body the document allows is read by protocol.py's decoders; a body with one envelope
property of the wrong kind is refused naming that property; the verbs listener serves the
document, and each listener serves exactly the paths the document gives it."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infergrid.errors import ContractError
from infergrid.openapi import OPENAPI_PATH, operations
from scheduler_extender import protocol
from scheduler_extender.openapi import DOCUMENT, METRICS_LISTENER, VERBS_LISTENER
from tests.fuzzing.hostile import field_root
from tests.fuzzing.schema_values import from_schema
from tests.scheduler_extender.test_http import service

DECODERS = {
    "/filter": protocol.decode_extender_args,
    "/prioritize": protocol.decode_extender_args,
    "/bind": protocol.decode_binding_args,
    "/preempt": protocol.decode_preemption_args,
}
BODIES = {path: schema for _, path, schema in operations(DOCUMENT) if schema is not None}
SHARE_POD = {"metadata": {"name": "p", "uid": "u1"}}
MINIMAL = {  # the least each verb reads, and the base each wrong kind is put into
    "/filter": {"Pod": SHARE_POD, "NodeNames": ["n1"]},
    "/prioritize": {"Pod": SHARE_POD, "NodeNames": ["n1"]},
    "/bind": {"PodName": "p", "PodNamespace": "default", "PodUID": "u1", "Node": "n1"},
    "/preempt": {"Pod": SHARE_POD},
}
WRONG_KINDS = {  # truthy, so no reader may take one for "absent"
    "object": [7, "a string", [1]],
    "array": [7, "a string", {"a": 1}],
    "string": [7, ["a"], {"a": 1}],
}


def test_every_verb_has_a_body_schema_and_a_decoder():
    assert set(BODIES) == set(DECODERS)


@pytest.mark.parametrize("path", sorted(DECODERS))
@settings(max_examples=60, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(data=st.data())
def test_a_body_the_document_allows_is_read(path, data):
    body = data.draw(from_schema(BODIES[path]))
    DECODERS[path](json.dumps(body).encode())


@pytest.mark.parametrize(
    "path, body",
    [
        ("/preempt", {"Pod": {"metadata": {}}, "NodeNameToMetaVictims": {
            "n1": {"Pods": [{"UID": "u1"}, {"UID": "u2"}], "NumPDBViolations": 1}}}),
        ("/preempt", {"Pod": {"metadata": {}}, "NodeNameToVictims": {
            "n1": {"Pods": [{"metadata": {"uid": "u1"}}], "NumPDBViolations": 0}}}),
        ("/filter", {"Pod": {"metadata": {}}, "NodeNames": ["n1"],
                     "Nodes": {"items": [{"metadata": {"name": "n2"}}]}}),
    ],
)  # fmt: skip
def test_the_maps_and_alternatives_the_document_describes_are_read(path, body):
    """Maps keyed by node name, which the drawn bodies leave empty, read as the document says."""
    DECODERS[path](json.dumps(body).encode())


def wrong_type_cases():
    for path, schema in sorted(BODIES.items()):
        for name, prop in schema["properties"].items():
            for value in WRONG_KINDS[prop["type"]]:
                yield pytest.param(path, name, value, id=f"{path}-{name}-{value!r}")


@pytest.mark.parametrize("path, name, value", list(wrong_type_cases()))
def test_a_property_of_the_wrong_kind_is_refused_naming_it(path, name, value):
    DECODERS[path](json.dumps(MINIMAL[path]).encode())
    body = {**MINIMAL[path], name: value}
    with pytest.raises(ContractError) as refused:
        DECODERS[path](json.dumps(body).encode())
    assert field_root(refused.value.field) == name


def served(app_name: str, method: str, path: str) -> tuple[int, bytes]:
    async def go():
        async with TestClient(TestServer(getattr(service(), app_name)())) as http:
            resp = await http.request(method, path)
            return resp.status, await resp.read()

    return asyncio.run(go())


def test_the_verbs_listener_serves_the_document_and_the_metrics_listener_does_not():
    status, body = served("app", "GET", OPENAPI_PATH)
    assert status == 200 and json.loads(body) == DOCUMENT
    assert served("metrics_app", "GET", OPENAPI_PATH)[0] == 404


@pytest.mark.parametrize(
    "app_name, listener", [("app", VERBS_LISTENER), ("metrics_app", METRICS_LISTENER)]
)
def test_each_listener_serves_exactly_the_paths_the_document_gives_it(app_name, listener):
    app = getattr(service(), app_name)()
    routes = {
        (r.method.lower(), r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"
    }
    documented = {
        (method, path)
        for path, methods in DOCUMENT["paths"].items()
        for method, op in methods.items()
        if listener in op["tags"]
    }
    assert routes == documented


# What the fuzzers found: each of these raised past the decoder and was answered
# "internal error: ..." with a 200, instead of a 400 naming the field.


DEEP_UID = b"".join(
    (b'{"Pod": {"metadata": {"uid": ', b"[" * 1000, b"]" * 1000, b'}}, "NodeNames": ["n1"]}')
)


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/filter", DEEP_UID, "Pod.metadata.uid"),
        ("/prioritize", {"Pod": {"metadata": {"name": 5}}, "NodeNames": ["n1"]},
         "Pod.metadata.name"),
        ("/filter", {"Pod": {"metadata": {}, "spec": [1]}, "NodeNames": ["n1"]}, "Pod.spec"),
        ("/filter", {"Pod": {"metadata": {}}, "Nodes": {"items": ["n1"]}},
         "Nodes.items[0].metadata.name"),
        ("/filter", {"Pod": {"metadata": {}}, "Nodes": {"items": {"n1": {}}}}, "Nodes.items"),
        ("/preempt", {"Pod": {"metadata": {}},
                      "NodeNameToVictims": {"n1": {"Pods": [{"metadata": 5}]}}},
         "NodeNameToVictims['n1'].Pods"),
    ],
)  # fmt: skip
def test_a_malformed_part_the_verbs_read_is_refused_naming_it(path, body, field):
    with pytest.raises(ContractError) as refused:
        DECODERS[path](body if isinstance(body, bytes) else json.dumps(body).encode())
    assert refused.value.field == field
