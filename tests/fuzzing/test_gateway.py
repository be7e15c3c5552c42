"""The gateway, as a process of its own in front of a real engine process, fuzzed from its own
OpenAPI document: never a 5xx, never a hung request, every 4xx names its field in the OpenAI
error's `param`, whether the gateway refused the body or relayed the engine's refusal.

Every operation is fuzzed with a tenant's key, which reaches the engine, and without one,
which must stop at the gateway. To reach the engine's generation and not only its refusals,
the bodies drawn take the engine's schema for each field the gateway passes on, name the
served model and ask for at most a few tokens (`reaching`); the hostile values put in place
of any field, those included, are as ever.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batching_engine.server.openapi import DOCUMENT as ENGINE_DOCUMENT
from gateway.openapi import DOCUMENT, METRICS
from harness.engine_process import free_port
from infergrid.openapi import operations
from tests.fuzzing.http_fuzz import (
    Answer,
    Surface,
    encoded,
    fuzz_operation,
    send,
)
from tests.gateway.engines import MODEL, start_engines

pytestmark = pytest.mark.timeout(600)
KEY = "sk-fuzz-tenant-0123456789"
ANSWER_TOKENS = 4  # the most tokens a drawn body asks for, so a case costs milliseconds
# Cases per operation in CI: a POST with a key reaches the engine, the rest stop at the gateway.
POST_EXAMPLES, GET_EXAMPLES, KEYLESS_EXAMPLES = 300, 15, 10
ROOT = Path(__file__).resolve().parents[2]
LONE_SURROGATE = {
    "/v1/chat/completions": {"model": MODEL, "max_tokens": 2,
                             "messages": [{"role": "user", "content": "hi \ud800"}]},
    "/v1/completions": {"model": MODEL, "max_tokens": 2, "prompt": "\ud800"},
    "/v1/embeddings": {"model": MODEL, "input": ["ok", "\udfff"]},
}  # fmt: skip


def param(answer: Answer) -> str | None:
    """The OpenAI error's `param`: the field a refusal names."""
    doc = answer.json()
    error = doc.get("error") if isinstance(doc, dict) else None
    return error.get("param") if isinstance(error, dict) else None


def hidden_failure(answer: Answer) -> str | None:
    """A 2xx carrying an error: a JSON error object, or a stream's error event."""
    if not 200 <= answer.status < 300:
        return None
    if answer.headers.get("Content-Type", "").startswith("text/event-stream"):
        errors = [e for e in answer.body.split(b"\n\n") if e.startswith(b'data: {"error"')]
        return f"a stream ended by an error event: {errors[0][:200]!r}" if errors else None
    doc = answer.json()
    return "a 2xx holding an error" if isinstance(doc, dict) and "error" in doc else None


def reaching(document: dict[str, Any]) -> dict[str, Any]:
    """The gateway's document with its bodies drawn to reach generation: each field the
    gateway passes on as the engine's own document describes it, the served model, and
    max_tokens required and small."""
    doc = copy.deepcopy(document)
    engine = {path: s for _, path, s in operations(ENGINE_DOCUMENT) if s is not None}
    for _method, path, schema in operations(doc):
        if schema is None:
            continue
        props = schema["properties"]
        for name, engine_schema in engine[path]["properties"].items():
            if name in props and name not in ("stream", "stream_options"):
                props[name] = engine_schema
        props["model"] = {"const": MODEL}
        for name in ("max_tokens", "max_completion_tokens"):
            if name in props:
                props[name] = {"type": "integer", "minimum": 1, "maximum": ANSWER_TOKENS}
        if "max_tokens" in props:
            schema["required"] = [*schema["required"], "max_tokens"]
    return doc


class GatewayProcess:
    """tests/fuzzing/gateway_process.py on free ports, in front of `urls`."""

    def __init__(self, urls: list[str], log: Path) -> None:
        self.engine_urls = urls
        self.port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}"
        ports = ["--port", str(self.port), "--metrics-port", str(self.metrics_port)]
        argv = [sys.executable, "-m", "tests.fuzzing.gateway_process", *ports, "--key", KEY, *urls]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        self.log = log

    def wait_ready(self, limit_s: float = 60.0) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"the gateway was not ready in {limit_s:g} s: {self.log}")

    def stop(self) -> int:
        """SIGTERM: the drain; the exit status."""
        self.proc.terminate()
        return self.proc.wait(30)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("gateway-fuzz")
    engines = start_engines(tmp, 1)
    process = GatewayProcess([e.url for e in engines], tmp / "gateway.log")
    try:
        process.wait_ready()
        yield process
        assert process.stop() == 0, process.log.read_text()
    finally:
        if process.proc.poll() is None:
            process.proc.kill()
        for engine in engines:
            engine.kill()


def surface(gateway: GatewayProcess, path: str, with_key: bool) -> Surface:
    base = gateway.metrics_url if path == METRICS else gateway.url
    return Surface(
        name=f"gateway{'' if with_key else ' without a key'}",
        base_url=base,
        document=reaching(DOCUMENT),
        named_field=param,
        headers={"Authorization": f"Bearer {KEY}"} if with_key else {},
        hidden_failure=hidden_failure,
    )


OPERATIONS = [(method, path) for method, path, _ in operations(DOCUMENT)]


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_every_operation_with_a_key_never_fails_hangs_or_refuses_without_naming_a_field(
    gateway, fuzz_budget, method, path
):
    examples = POST_EXAMPLES if method == "post" else GET_EXAMPLES
    fuzz_operation(surface(gateway, path, with_key=True), method, path, fuzz_budget(examples))


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_every_operation_without_a_key_is_refused_by_the_gateway_and_never_fails(
    gateway, fuzz_budget, method, path
):
    keyless = surface(gateway, path, with_key=False)
    fuzz_operation(keyless, method, path, fuzz_budget(KEYLESS_EXAMPLES))


@pytest.mark.parametrize("path", sorted(LONE_SURROGATE))
def test_a_lone_surrogate_prompt_is_the_engines_400_naming_the_field_relayed_unchanged(
    gateway, path
):
    raw = encoded(LONE_SURROGATE[path])
    assert b"\\ud800" in raw or b"\\udfff" in raw  # sent as JSON allows: an escape
    via_gateway = send(surface(gateway, path, with_key=True), "post", path, raw)
    direct = send(Surface("engine", gateway.engine_urls[0], {}, param), "post", path, raw)
    assert via_gateway.status == 400, via_gateway.body
    assert param(via_gateway).split("[")[0].split(".")[0] in LONE_SURROGATE[path]
    assert (via_gateway.status, via_gateway.body) == (direct.status, direct.body)
