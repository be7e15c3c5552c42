"""The gateway's OpenAPI document says what its body reader does: the bodies it allows are
read, the fields it checks are refused by name when wrong, and it lists every route served."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp
import pytest
from hypothesis import given, settings

from batching_engine.server.openapi import DOCUMENT as ENGINE_DOCUMENT
from gateway.app import Gateway
from gateway.catalog import Catalog
from gateway.config import GatewayConfig
from gateway.live_catalog import LiveCatalog
from gateway.openapi import DOCUMENT, METRICS, READ, body_schema
from gateway.request_body import CHAT, COMPLETIONS, EMBEDDINGS, FIELDS, parse_request
from infergrid.errors import ContractError
from infergrid.openapi import OPENAPI_PATH, operations
from tests.fuzzing.http_fuzz import encoded
from tests.fuzzing.schema_values import from_schema
from tests.gateway.engines import OPEN, gateway_serving

ENDPOINTS = (CHAT, COMPLETIONS, EMBEDDINGS)
VALID = {
    CHAT: {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
    COMPLETIONS: {"model": "tiny", "prompt": "hi"},
    EMBEDDINGS: {"model": "tiny", "input": "hi"},
}
WRONG_TYPE = {"string": 7, "boolean": "yes", "integer": "3", "object": [1], "array": "x"}
ENGINE_EXTENSIONS = ("top_k", "ignore_eos", "priority")
CHECKED = ("model", "stream")  # the fields the gateway refuses itself; the engine the rest


def refused_field(body: dict, endpoint: str) -> str | None:
    try:
        parse_request(encoded(body), endpoint)
    except ContractError as err:
        return err.field
    return None


def test_the_document_lists_every_route_the_gateway_serves_and_no_other():
    async def served() -> set[tuple[str, str]]:
        gateway = Gateway(OPEN, LiveCatalog(asyncio.get_running_loop()))
        routes = [*gateway.app().router.routes(), *gateway.metrics_app().router.routes()]
        return {(r.method.lower(), r.resource.canonical) for r in routes if r.method != "HEAD"}

    documented = {(method, path) for method, path, _ in operations(DOCUMENT)}
    assert asyncio.run(served()) == documented


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_each_body_allows_exactly_the_fields_the_gateway_knows(endpoint):
    schema = body_schema(endpoint)
    assert set(schema["properties"]) == FIELDS[endpoint]
    assert schema["additionalProperties"] is False
    assert refused_field({**VALID[endpoint], "max_token": 3}, endpoint) == "max_token"


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_every_field_the_engine_reads_passes_the_gateway_but_another_endpoints_openai_ones(
    endpoint,
):
    """The engine's extensions (priority on embeddings too) reach it; an OpenAI field of
    another endpoint (`echo` on a chat) is refused by name, as OpenAI does."""
    engine = next(s for _, p, s in operations(ENGINE_DOCUMENT) if p == endpoint)["properties"]
    other_endpoints = set().union(*(FIELDS[e] for e in ENDPOINTS if e != endpoint))
    assert set(engine) - FIELDS[endpoint] <= other_endpoints - set(ENGINE_EXTENSIONS)
    for name in set(engine) - FIELDS[endpoint]:
        assert refused_field({**VALID[endpoint], name: None}, endpoint) == name


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_every_body_the_schema_allows_is_read(endpoint):
    @settings(max_examples=150, derandomize=True, database=None, deadline=None)
    @given(body=from_schema(body_schema(endpoint)))
    def read(body):
        parsed = parse_request(encoded(body), endpoint)
        assert parsed.model == body["model"]
        assert parsed.stream is body.get("stream", False)

    read()


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("name", CHECKED)
def test_a_wrong_type_in_a_field_the_gateway_checks_is_refused_naming_it(endpoint, name):
    wrong = WRONG_TYPE[READ[name]["type"]]
    assert refused_field({**VALID[endpoint], name: wrong}, endpoint) == name


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_wrong_type_in_a_field_only_the_engine_checks_is_passed_on(endpoint):
    """The gateway reads these to bound a request's cost and forwards them as they came;
    the engine refuses a wrong one, naming it, and the gateway relays that 400 (its fuzzer
    shows it through both)."""
    passed_on = sorted((set(READ) & FIELDS[endpoint]) - set(CHECKED))
    assert passed_on
    for name in passed_on:
        assert refused_field({**VALID[endpoint], name: {"no": "shape"}}, endpoint) is None


def test_the_document_is_served_without_a_key_and_metrics_only_on_their_own_listener():
    async def run():
        keys_required = replace(GatewayConfig(), api_keys_secret="infergrid/keys")
        async with gateway_serving(Catalog(), keys_required) as (_, url):
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{url}{OPENAPI_PATH}") as resp:
                    doc = (resp.status, await resp.json())
                async with http.get(f"{url}{METRICS}") as resp:
                    metrics = resp.status
        return doc, metrics

    (status, doc), metrics = asyncio.run(run())
    assert (status, doc) == (200, DOCUMENT)
    assert metrics == 404
