"""The engine fuzzed as a real `infergrid-engine` process, from its own OpenAPI document.

Every operation of `batching_engine.server.openapi.DOCUMENT` gets bodies its schema allows,
the same bodies with one value made hostile (lone surrogates, NULs, right-to-left marks,
huge strings, deep nesting, int64 and float edges), arbitrary JSON and raw bytes
(`tests.fuzzing.http_fuzz`). The property: never a 5xx, never a hung request, never an
error hidden in a 200, and every 4xx names the field in the OpenAI error's `param`.

The engine serves the tiny random Llama with a 64-token context: `max_tokens` may be drawn
up to 2^20, and a generation ends at the context's end, so no case waits on a long one.
The document is narrowed to what any engine serving the model accepts (`pinned`: the name
/v1/models gives, priority 0, token ids below 256), so that drawn bodies get past the
model's own checks to the tokenizer, the generator and the embedder; hostile values still
replace those fields.

To fuzz an engine that is already running (another build, a pod's forwarded port) instead
of starting one, point INFERGRID_FUZZ_ENGINE_URL at it:

    INFERGRID_FUZZ_ENGINE_URL=http://127.0.0.1:8000 \\
        .venv/bin/python -m pytest -q -p no:cacheprovider tests/fuzzing/test_engine.py

`--fuzz-long` runs 50 times as many cases from a random seed.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from batching_engine.server.openapi import DOCUMENT
from harness.engine_process import EngineProcess
from harness.tiny_model_dir import write_tiny_model
from infergrid.openapi import operations
from tests.fuzzing.http_fuzz import Answer, Case, Surface, check, encoded, fuzz_operation, send

URL_ENV = "INFERGRID_FUZZ_ENGINE_URL"
ENGINE_ARGS = ["--model-name", "tiny", "--max-model-len", "64", "--kv-cache-memory", "8MiB",
               "--cpu-threads", "1"]  # fmt: skip
# Cases per operation in CI: generation routes cost a model run per case, the rest little.
# The bodies of only the required fields get their own, fewer cases (see `least`).
EXAMPLES = {"/v1/completions": 250, "/v1/chat/completions": 200, "/v1/embeddings": 300}
GET_EXAMPLES = 20
LEAST_EXAMPLES = 200


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The engine INFERGRID_FUZZ_ENGINE_URL names, else one started for this module."""
    if os.environ.get(URL_ENV):
        yield os.environ[URL_ENV].rstrip("/")
        return
    tmp: Path = tmp_path_factory.mktemp("fuzz-engine")
    model = write_tiny_model(tmp / "tiny")
    engine = EngineProcess(["--model", str(model), *ENGINE_ARGS], tmp / "engine.log")
    try:
        engine.wait_ready()
        yield engine.url
    finally:
        engine.kill()


@pytest.fixture(scope="module")
def surface(engine_url: str) -> Surface:
    bare = Surface("engine", engine_url, DOCUMENT, param, hidden_failure=server_error)
    served = send(bare, "get", "/v1/models", None).json()["data"][0]["id"]
    return replace(bare, document=pinned(DOCUMENT, served))


def param(answer: Answer) -> str | None:
    """The field an OpenAI error names."""
    doc = answer.json()
    error = doc.get("error") if isinstance(doc, dict) else None
    return error.get("param") if isinstance(error, dict) else None


def server_error(answer: Answer) -> str | None:
    """A 200 carrying the engine's failure: a stream's error event."""
    if answer.status == 200 and b'"server_error"' in answer.body:
        return "a server_error inside a 200"
    return None


def pinned(doc: dict[str, Any], model: str) -> dict[str, Any]:
    """The document narrowed to what any engine serving `model` accepts: that model name,
    priority 0 (every engine has that class) and token ids below 256 (every byte-level
    vocabulary holds those). Drawn bodies then get past the model's own checks to the
    tokenizer, the generator and the embedder, and `mutated` still breaks these fields."""
    narrowed = {"model": {"const": model}, "priority": {"enum": [0, None]}}

    def narrow(schema: Any) -> None:
        if not isinstance(schema, dict):
            return
        for name in narrowed.keys() & schema.get("properties", {}).keys():
            schema["properties"][name] = narrowed[name]
        for sub in (*schema.get("properties", {}).values(), *schema.get("anyOf", ())):
            narrow(sub)
        if schema.get("items") == {"type": "integer", "minimum": 0}:
            schema["items"] = {"type": "integer", "minimum": 0, "maximum": 255}
        narrow(schema.get("items"))

    out = copy.deepcopy(doc)
    for _, _, schema in operations(out):
        narrow(schema)
    return out


def least(doc: dict[str, Any]) -> dict[str, Any]:
    """The document with each body cut to its required fields (the prompt, the messages, the
    input): a mutation then lands in the field that reaches the tokenizer, rather than in one
    of the dozen optional ones, which the full bodies cover."""

    def cut(schema: dict[str, Any]) -> None:
        keep = set(schema.get("required", ()))
        if "properties" in schema:
            schema["properties"] = {k: v for k, v in schema["properties"].items() if k in keep}
        for sub in schema.get("anyOf", ()):
            cut(sub)

    out = copy.deepcopy(doc)
    for _, _, schema in operations(out):
        if schema is not None:
            cut(schema)
    return out


@pytest.mark.parametrize(
    "method, path", [(m, p) for m, p, _ in operations(DOCUMENT)], ids=lambda v: str(v)
)
def test_no_input_gets_a_5xx_a_hang_or_a_refusal_naming_no_field(
    surface: Surface, fuzz_budget, method: str, path: str
):
    fuzz_operation(surface, method, path, fuzz_budget(EXAMPLES.get(path, GET_EXAMPLES)))


@pytest.mark.parametrize("path", sorted(EXAMPLES))
def test_no_mutation_of_a_required_field_gets_a_5xx_or_a_hang(
    surface: Surface, fuzz_budget, path: str
):
    required_only = replace(surface, name="engine, required fields only",
                            document=least(surface.document))  # fmt: skip
    fuzz_operation(required_only, "post", path, fuzz_budget(LEAST_EXAMPLES))


SURROGATES = [
    ("/v1/completions", {"prompt": "\ud800"}, "prompt"),
    ("/v1/completions", {"prompt": ["ok \udfff"]}, "prompt[0]"),
    ("/v1/completions", {"prompt": "ok", "stop": ["\udbff"]}, "stop[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]},
     "messages[0].content"),
    ("/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "text", "text": "a\udc00b"}]}]},
     "messages[0].content[0].text"),
    ("/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "model": "\ud800"}, "model"),
    ("/v1/embeddings", {"input": "\ud800"}, "input"),
    ("/v1/embeddings", {"input": ["ok", "\udfff"]}, "input[1]"),
]  # fmt: skip


@pytest.mark.parametrize("path, body, field", SURROGATES, ids=lambda v: json.dumps(v)[:40])
def test_a_lone_surrogate_is_a_400_naming_its_field(
    surface: Surface, path: str, body: dict[str, Any], field: str
):
    """The issue's careless user: valid JSON (`"\\ud800"`) that decodes to no text."""
    case = Case(encoded(body), body)
    answer = send(surface, "post", path, case.raw)
    schema = next(s for m, p, s in operations(DOCUMENT) if p == path)
    check(surface, schema, case, answer)
    assert (answer.status, param(answer)) == (400, field), answer.body
