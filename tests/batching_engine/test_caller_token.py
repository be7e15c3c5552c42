"""An engine with a token file answers /v1/* only to callers holding its token, over real
HTTP: everyone else gets a 401 naming the header, and the engine counts and queues nothing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from batching_engine.main import parser, settings_from
from harness.engine_process import requests_seen
from harness.tiny_model_dir import write_tiny_model
from infergrid.engine_token import HEADER, TOKEN_FILE_ENV, derive
from infergrid.errors import ContractError
from tests.batching_engine.server_thread import ServerThread

pytestmark = pytest.mark.timeout(120)
KEY = b"k" * 32
TOKEN = derive(KEY, "team-a", "chat")
COMPLETION = {"model": "tiny", "prompt": "hello", "max_tokens": 2, "temperature": 0}


def call(url: str, path: str, headers: dict[str, str], body: Any = None) -> tuple[int, Any]:
    async def go() -> tuple[int, Any]:
        async with aiohttp.ClientSession() as http:
            method = "GET" if body is None else "POST"
            data = None if body is None else json.dumps(body)
            async with http.request(method, url + path, data=data, headers=headers) as resp:
                text = await resp.text()
                is_json = resp.content_type == "application/json"
                return resp.status, json.loads(text) if is_json else text

    return asyncio.run(go())


@pytest.fixture(scope="module")
def model_args(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    model = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny")
    return ["--model", str(model), "--model-name", "tiny", "--kv-cache-memory", "8MiB"]


@pytest.fixture(scope="module")
def guarded(model_args: list[str], tmp_path_factory: pytest.TempPathFactory):
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text(TOKEN + "\n")
    settings = settings_from(parser().parse_args(model_args), {TOKEN_FILE_ENV: str(token_file)})
    with ServerThread(settings) as server:
        yield server


def counted(server: ServerThread) -> float:
    status, text = call(server.url, "/metrics", {})
    assert status == 200
    return requests_seen(text)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {HEADER: "wrong"},
        {HEADER: derive(KEY, "team-b", "chat")},  # another service's token
        {HEADER: derive(KEY, "team-a", "chat-2")},
        {"Authorization": f"Bearer {TOKEN}"},  # only the dedicated header counts
        {HEADER: TOKEN[:-1]},
    ],
    ids=["none", "wrong", "other-namespace", "other-service", "authorization", "prefix"],
)
def test_a_caller_without_the_services_token_gets_a_401_naming_the_header(
    guarded: ServerThread, headers: dict[str, str]
) -> None:
    before = counted(guarded)
    for path, body in (("/v1/completions", COMPLETION), ("/v1/chat/completions", {}),
                       ("/v1/embeddings", {}), ("/v1/models", None)):  # fmt: skip
        status, doc = call(guarded.url, path, headers, body)
        assert status == 401, path
        assert doc["error"]["param"] == HEADER
        assert HEADER in doc["error"]["message"]
        assert doc["error"]["code"] == "invalid_engine_token"
    assert counted(guarded) == before


def test_the_services_token_is_served(guarded: ServerThread) -> None:
    before = counted(guarded)
    status, doc = call(guarded.url, "/v1/completions", {HEADER: TOKEN}, COMPLETION)
    assert status == 200, doc
    assert doc["usage"]["completion_tokens"] == 2
    assert counted(guarded) == before + 1


def test_probes_and_metrics_stay_open_for_the_kubelet_and_the_scrapers(
    guarded: ServerThread,
) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        assert call(guarded.url, path, {})[0] == 200, path


def test_an_unreadable_or_empty_token_file_stops_the_engine_naming_the_variable(
    model_args: list[str], tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    args = parser().parse_args(model_args)
    for path in (tmp_path / "absent", empty):
        with pytest.raises(ContractError) as err:
            settings_from(args, {TOKEN_FILE_ENV: str(path)})
        assert err.value.field == TOKEN_FILE_ENV


def test_without_a_token_file_the_engine_checks_nothing(model_args: list[str]) -> None:
    assert settings_from(parser().parse_args(model_args), {}).caller_token == ""
