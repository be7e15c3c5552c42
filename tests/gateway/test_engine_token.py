"""The gateway sends each engine its service's token (infergrid/engine_token.py), derived
from the key it was given: a real engine process holding the token of service ml/tiny
serves the gateway with that key, and no other."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp
import pytest

from gateway.catalog import Catalog
from gateway.config import GatewayConfig
from harness.engine_process import EngineProcess
from harness.tiny_model_dir import write_tiny_model
from infergrid.engine_token import HEADER, TOKEN_FILE_ENV, derive
from tests.gateway.engines import MODEL, backend, gateway_serving, reached, route

pytestmark = pytest.mark.timeout(300)
KEY = b"gateway-and-operator-shared-key!"
BODY = {"model": MODEL, "prompt": "hello", "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine")
    (tmp / "token").write_text(derive(KEY, "ml", "tiny"))
    args = ["--model", str(write_tiny_model(tmp / "tiny")), "--model-name", MODEL,
            "--kv-cache-memory", "8MiB", "--cpu-threads", "1"]  # fmt: skip
    started = EngineProcess(args, tmp / "engine.log", {TOKEN_FILE_ENV: str(tmp / "token")})
    started.wait_ready()
    yield started
    started.kill()


def post_through_gateway(engine: EngineProcess, key: bytes) -> tuple[int, dict, float]:
    """One completion through a gateway holding `key`, with the client's own Authorization;
    its status and body, and how many requests the engine served meanwhile."""

    async def run() -> tuple[int, dict, float]:
        cfg = replace(GatewayConfig(), engine_token_key=key)
        catalog = Catalog({MODEL: route([backend(engine)])})
        async with gateway_serving(catalog, cfg) as (_, url), aiohttp.ClientSession() as http:
            before = await reached(http, engine)
            headers = {"Authorization": "Bearer sk-client-key"}
            async with http.post(f"{url}/v1/completions", json=BODY, headers=headers) as r:
                status, doc = r.status, await r.json()
            return status, doc, await reached(http, engine) - before

    return asyncio.run(run())


def test_the_gateway_with_the_key_is_served(engine: EngineProcess) -> None:
    status, doc, served = post_through_gateway(engine, KEY)
    assert status == 200, doc
    assert served == 1


@pytest.mark.parametrize("key", [b"", b"another-key-of-thirty-two-bytes!"], ids=["none", "other"])
def test_without_the_key_the_engine_refuses_the_gateway_too(engine: EngineProcess, key) -> None:
    status, doc, served = post_through_gateway(engine, key)
    assert status == 401
    assert doc["error"]["param"] == HEADER
    assert served == 0
