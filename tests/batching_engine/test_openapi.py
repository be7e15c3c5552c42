"""The engine's OpenAPI document cannot drift from its body parsers or its routes.

Both ways: every body the document allows is read by `protocol`'s parsers, and a value one
property's schema refuses is refused by the parser naming that property. Every key the
parsers look at, at any depth, is one the document describes (a field added to a parser
alone fails here), and the app serves exactly the document's routes, the document included.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from batching_engine.config import EngineConfig
from batching_engine.metrics import EngineMetrics
from batching_engine.server.app import EngineServer
from batching_engine.server.json_fields import RequestError
from batching_engine.server.openapi import DOCUMENT
from batching_engine.server.protocol import parse_chat, parse_completion, parse_embedding
from infergrid.openapi import OPENAPI_PATH, operations
from tests.fuzzing.hostile import field_root
from tests.fuzzing.schema_values import from_schema

PARSERS: dict[str, Callable[[object], object]] = {
    "/v1/completions": parse_completion,
    "/v1/chat/completions": parse_chat,
    "/v1/embeddings": parse_embedding,
}
BODIES = {path: schema for _, path, schema in operations(DOCUMENT) if schema is not None}
MINIMAL = {  # the least each route reads, and the base each refused value is put into
    "/v1/completions": {"prompt": "hello"},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hello"}]},
    "/v1/embeddings": {"input": "hello"},
}
# Values of every JSON kind, at the edges the schemas draw: each property is given each of
# these that its schema refuses.
CANDIDATES = (
    None, True, False, 0, -1, 1, 2, 1.5, 0.0, 1 << 70, -(1 << 70), "", "a string", "float",
    [], [1], [-1], ["a"], [1.5], [[]], [{}], {}, {"a": 1}, {"type": "text"},
)  # fmt: skip


def test_the_document_is_openapi_3_1_and_its_schemas_are_json_schema_2020_12():
    assert DOCUMENT["openapi"] == "3.1.0"
    for path, methods in DOCUMENT["paths"].items():
        for method, op in methods.items():
            assert op["responses"], f"{method} {path} answers nothing"
            for answer in op["responses"].values():
                for media in answer.get("content", {}).values():
                    Draft202012Validator.check_schema(media.get("schema", {}))
    for schema in BODIES.values():
        Draft202012Validator.check_schema(schema)


def test_every_route_with_a_body_has_a_parser():
    assert set(BODIES) == set(PARSERS)


@pytest.mark.parametrize("path", sorted(PARSERS))
@settings(max_examples=150, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(data=st.data())
def test_a_body_the_document_allows_is_read(path, data):
    body = data.draw(from_schema(BODIES[path]))
    Draft202012Validator(BODIES[path]).validate(body)  # the drawn body is one the schema allows
    PARSERS[path](body)


def refused_values() -> list[Any]:
    return [
        pytest.param(path, name, value, id=f"{path}-{name}-{value!r}")
        for path, schema in sorted(BODIES.items())
        for name, prop in schema["properties"].items()
        for value in CANDIDATES
        if not Draft202012Validator(prop).is_valid(value)
    ]


@pytest.mark.parametrize("path, name, value", refused_values())
def test_a_value_the_property_refuses_is_refused_naming_it(path, name, value):
    PARSERS[path](MINIMAL[path])
    body = {**MINIMAL[path], name: value}
    assert not Draft202012Validator(BODIES[path]).is_valid(body)
    with pytest.raises(RequestError) as refused:
        PARSERS[path](body)
    assert field_root(refused.value.field) == name


# The keys a parser reads, by path: `messages[].content`, `stream_options.include_usage`.


class ReadLog(dict):
    """A JSON object that records every key looked up in it, at its path in the body."""

    def __init__(self, doc: dict[str, Any], path: str, seen: set[str]) -> None:
        super().__init__({key: logged(value, f"{path}{key}", seen) for key, value in doc.items()})
        self._path, self._seen = path, seen

    def get(self, key: Any, default: Any = None) -> Any:
        self._seen.add(f"{self._path}{key}")
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self._seen.add(f"{self._path}{key}")
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self._seen.add(f"{self._path}{key}")
        return super().__contains__(key)


def logged(value: Any, path: str, seen: set[str]) -> Any:
    if isinstance(value, dict):
        return ReadLog(value, f"{path}." if path else "", seen)
    if isinstance(value, list):
        return [logged(item, f"{path}[]", seen) for item in value]
    return value


def described(schema: dict[str, Any], path: str = "") -> set[str]:
    """Every property path a schema describes, through anyOf, oneOf and items."""
    found: set[str] = set()
    for name, sub in schema.get("properties", {}).items():
        found |= {f"{path}{name}"} | described(sub, f"{path}{name}.")
    for sub in (*schema.get("anyOf", ()), *schema.get("oneOf", ())):
        found |= described(sub, path)
    if "items" in schema:
        found |= described(schema["items"], f"{path.removesuffix('.')}[].")
    return found


def keys_read(path: str, body: dict[str, Any]) -> set[str]:
    seen: set[str] = set()
    PARSERS[path](logged(body, "", seen))
    return seen


@pytest.mark.parametrize("path", sorted(PARSERS))
@settings(max_examples=100, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(data=st.data())
def test_every_key_a_parser_reads_is_one_the_document_describes(path, data):
    body = data.draw(from_schema(BODIES[path]))
    assert keys_read(path, body) <= described(BODIES[path])


@pytest.mark.parametrize("path", sorted(PARSERS))
def test_every_field_the_document_describes_is_read(path):
    """From the least body, the parser looks up every top-level field (absent or null)."""
    top_level = {key for key in keys_read(path, MINIMAL[path]) if "." not in key and "[" not in key}
    assert top_level == set(BODIES[path]["properties"])


@pytest.mark.parametrize(
    "body, reads",
    [
        ({"prompt": "a", "stream": True, "stream_options": {"include_usage": True}},
         "stream_options.include_usage"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]},
         "messages[].content[].text"),
    ],
)  # fmt: skip
def test_nested_reads_are_logged_at_their_path(body, reads):
    """The read log itself: without it, the test above would pass by seeing nothing."""
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    seen = keys_read(path, body)
    assert reads in seen and reads in described(BODIES[path])


# The app serves the document, and exactly the routes it describes; no model is needed.


def engine_app():
    return EngineServer(EngineConfig(), EngineMetrics()).app()


def test_the_app_serves_the_document():
    async def go() -> tuple[int, bytes]:
        async with TestClient(TestServer(engine_app())) as http:
            resp = await http.get(OPENAPI_PATH)
            return resp.status, await resp.read()

    status, body = asyncio.run(go())
    assert status == 200 and json.loads(body) == json.loads(json.dumps(DOCUMENT))


def test_the_app_serves_exactly_the_routes_the_document_describes():
    routes = {
        (r.method.lower(), r.resource.canonical)
        for r in engine_app().router.routes()
        if r.method != "HEAD"
    }
    documented = {(method, path) for method, path, _ in operations(DOCUMENT)}
    assert routes == documented
