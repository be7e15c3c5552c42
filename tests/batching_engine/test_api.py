"""The HTTP API over real sockets, with a tiny random Llama and a tokenizer made here."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batching_engine.config import EngineConfig, Settings
from batching_engine.main import parser, settings_from
from batching_engine.metrics import EngineMetrics
from batching_engine.server.app import EngineServer, start_site
from harness.tiny_model_dir import write_tiny_model
from tests.batching_engine.server_thread import ServerThread

pytestmark = pytest.mark.timeout(120)
MAX_BODY = 64 * 1024
GREEDY = {"temperature": 0, "ignore_eos": True}
SYSTEM = "you are a helpful assistant. answer briefly and politely. " * 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny")


def settings(model_dir: Path, *flags: str) -> Settings:
    args = [
        "--model",
        str(model_dir),
        "--model-name",
        "tiny",
        "--kv-cache-memory",
        "8MiB",
        "--max-body-bytes",
        str(MAX_BODY),
        *flags,
    ]
    return settings_from(parser().parse_args(args), {})


@pytest.fixture(scope="module")
def served(model_dir: Path):
    with ServerThread(settings(model_dir, "--max-num-seqs", "8")) as server:
        yield server


# A tiny synchronous client over aiohttp, one event loop per call.


def request(
    url: str, method: str = "GET", body: Any = None, raw: bytes | None = None
) -> tuple[int, dict[str, str], Any]:
    async def go() -> tuple[int, dict[str, str], Any]:
        async with aiohttp.ClientSession() as http:
            data = raw if raw is not None else None if body is None else json.dumps(body)
            async with http.request(method, url, data=data) as resp:
                text = await resp.text()
                ctype = resp.headers.get("Content-Type", "")
                doc = json.loads(text) if ctype.startswith("application/json") else text
                return resp.status, dict(resp.headers), doc

    return asyncio.run(go())


def sse_events(text: str) -> list[Any]:
    """The `data:` payloads of an event stream, JSON-decoded except the final [DONE]."""
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line.strip()]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def metric_samples(url: str) -> dict[tuple[str, tuple], float]:
    status, _, text = request(url + "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def metric(url: str, name: str, **labels: str) -> float:
    return metric_samples(url)[(name, tuple(sorted(labels.items())))]


def wait_for(condition: Callable[[], bool], what: str, limit_s: float = 30.0) -> None:
    """Poll until `condition` holds; the limit only turns a hang into a failure."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


# Generation.


def test_a_completion_returns_text_usage_and_a_finish_reason(served: ServerThread) -> None:
    status, _, doc = request(
        served.url + "/v1/completions",
        "POST",
        {"model": "tiny", "prompt": "hello world", "max_tokens": 6, **GREEDY},
    )
    assert status == 200
    assert doc["object"] == "text_completion" and doc["model"] == "tiny"
    choice = doc["choices"][0]
    assert isinstance(choice["text"], str) and choice["finish_reason"] == "length"
    assert doc["usage"]["completion_tokens"] == 6
    assert doc["usage"]["total_tokens"] == doc["usage"]["prompt_tokens"] + 6


def test_greedy_output_is_the_same_for_text_and_its_token_ids(served: ServerThread) -> None:
    from batching_engine.tokenizer import Tokenizer

    ids = Tokenizer(served.settings.model_uri).encode("the quick brown fox")
    bodies = [{"prompt": "the quick brown fox"}, {"prompt": ids}]
    texts = [
        request(served.url + "/v1/completions", "POST", b | {"max_tokens": 8, **GREEDY})[2]
        for b in bodies
    ]
    assert texts[0]["choices"] == texts[1]["choices"]


def chat(served: ServerThread, **extra: Any) -> tuple[int, dict[str, str], Any]:
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "what is the capital of france?"},
        ],
        "max_tokens": 12,
        **GREEDY,
        **extra,
    }
    return request(served.url + "/v1/chat/completions", "POST", body)


def test_chat_streams_sse_chunks_that_add_up_to_the_full_answer(served: ServerThread) -> None:
    _, _, full = chat(served)
    status, headers, text = chat(served, stream=True, stream_options={"include_usage": True})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(text)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert content == full["choices"][0]["message"]["content"]
    assert usage["choices"] == [] and usage["usage"] == full["usage"]


def test_a_stop_string_ends_the_output_before_it_streamed_or_not(served: ServerThread) -> None:
    body = {"prompt": "hello world", "max_tokens": 40, **GREEDY}
    free = request(served.url + "/v1/completions", "POST", body)[2]["choices"][0]["text"]
    stop = next(
        free[k : k + 2]
        for k in range(2, len(free) - 2)
        if free[k : k + 2].isascii() and free[k : k + 2].isalnum()
    )
    expected = free[: free.index(stop)]
    cut = request(served.url + "/v1/completions", "POST", body | {"stop": [stop]})[2]
    assert (cut["choices"][0]["text"], cut["choices"][0]["finish_reason"]) == (expected, "stop")
    _, _, text = request(
        served.url + "/v1/completions", "POST", body | {"stop": stop, "stream": True}
    )
    chunks = sse_events(text)[:-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


# Embeddings.


def test_embeddings_are_unit_vectors_independent_of_their_batch(served: ServerThread) -> None:
    status, _, doc = request(
        served.url + "/v1/embeddings", "POST", {"input": ["hello world", "the lazy dog", [5, 6, 7]]}
    )
    assert status == 200 and doc["object"] == "list"
    vectors = np.array([d["embedding"] for d in doc["data"]])
    assert [d["index"] for d in doc["data"]] == [0, 1, 2] and vectors.shape == (3, 64)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    _, _, alone = request(
        served.url + "/v1/embeddings",
        "POST",
        {"input": "the lazy dog", "encoding_format": "base64"},
    )
    decoded = np.frombuffer(base64.b64decode(alone["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, vectors[1], atol=1e-5)


def test_models_lists_the_served_model(served: ServerThread) -> None:
    status, _, doc = request(served.url + "/v1/models")
    assert status == 200 and [m["id"] for m in doc["data"]] == ["tiny"]
    assert doc["data"][0]["max_model_len"] == 256


def test_probes_pass_once_the_model_is_loaded(served: ServerThread) -> None:
    assert request(served.url + "/healthz")[0] == 200
    assert request(served.url + "/readyz")[0] == 200


@pytest.mark.parametrize("task", ["text-generation", "embedding"])
def test_ready_only_after_one_warm_up_request_is_answered(model_dir: Path, task: str) -> None:
    with ServerThread(settings(model_dir, "--task", task), warm_up=False) as server:
        assert request(server.url + "/healthz")[0] == 200
        status, _, doc = request(server.url + "/readyz")
        assert (status, doc["status"]) == (503, "warming up")
        assert server.call(server.server.warm_up()).result(timeout=60) > 0
        assert request(server.url + "/readyz")[0] == 200


# Errors.


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", b"{not json", "body"),
        ("/v1/completions", b"[]", "body"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "temperature": "hot"}, "temperature"),
        ("/v1/completions", {"prompt": [1, 99999]}, "prompt[1]"),
        ("/v1/completions", {"prompt": "x " * 300}, "prompt"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x " * 300}]},
            "messages",
        ),
        ("/v1/completions", {"prompt": "x", "priority": 7}, "priority"),
        ("/v1/chat/completions", {"max_tokens": 3}, "messages"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "bot", "content": "x"}]},
            "messages[0].role",
        ),
        ("/v1/embeddings", {"input": ["ok", ""]}, "input[1]"),
        ("/v1/completions", {"prompt": "a \ud800"}, "prompt"),  # sent as "\\ud800": valid JSON
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "\udfff"}]},
            "messages[0].content",
        ),
        ("/v1/embeddings", {"input": "\ud800"}, "input"),
        ("/v1/embeddings", {"input": "x", "priority": 9}, "priority"),
    ],
)
def test_bad_input_gets_a_400_naming_the_field(
    served: ServerThread, path: str, body: Any, param: str
) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, _, doc = request(served.url + path, "POST", raw=raw)
    assert status == 400, doc
    assert doc["error"]["type"] == "invalid_request_error" and doc["error"]["param"] == param
    assert doc["error"]["message"].startswith(param)


def test_a_body_over_the_limit_gets_a_413(served: ServerThread) -> None:
    raw = json.dumps({"prompt": "x" * (MAX_BODY + 1)}).encode()
    status, _, doc = request(served.url + "/v1/completions", "POST", raw=raw)
    assert status == 413 and doc["error"]["param"] == "body"


def test_a_wrong_model_name_gets_a_404_naming_model(served: ServerThread) -> None:
    status, _, doc = request(
        served.url + "/v1/chat/completions",
        "POST",
        {"model": "gpt-5", "messages": [{"role": "user", "content": "x"}]},
    )
    assert status == 404
    assert doc["error"]["param"] == "model" and doc["error"]["code"] == "model_not_found"


def test_an_unknown_route_gets_a_json_404(served: ServerThread) -> None:
    status, _, doc = request(served.url + "/v1/nothing")
    assert status == 404 and "error" in doc


# The worker can be held with a job that waits on an event: the engine then takes no step,
# which makes "the queue is full" and "the client left mid-stream" deterministic.


def hold_worker(served: ServerThread) -> threading.Event:
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait()

    assert served.server is not None and served.server.engine is not None
    served.call(served.server.engine.run_job(hold))
    started.wait(timeout=30)
    return release


def test_a_full_queue_gets_429_with_retry_after(model_dir: Path) -> None:
    flags = ("--max-num-seqs", "1", "--max-queue-size", "2")
    with ServerThread(settings(model_dir, *flags)) as served:
        release = hold_worker(served)
        try:
            results = asyncio.run(five_at_once(served.url, release))
        finally:
            release.set()
    assert sorted(status for status, _ in results) == [200, 200, 429, 429, 429]
    assert all(int(after) >= 1 for status, after in results if status == 429)


async def five_at_once(url: str, release: threading.Event) -> list[tuple[int, str | None]]:
    """Five completions together while the worker is held: the queue takes two, the other
    three are answered at once; then the worker goes on and the two finish."""
    async with aiohttp.ClientSession() as http:

        async def one() -> tuple[int, str | None]:
            body = {"prompt": "hello", "max_tokens": 3, **GREEDY}
            async with http.post(url + "/v1/completions", json=body) as resp:
                await resp.read()
                return resp.status, resp.headers.get("Retry-After")

        tasks = [asyncio.create_task(one()) for _ in range(5)]
        pending: set[asyncio.Task] = set(tasks)
        while len(pending) > 2:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        release.set()
        return await asyncio.gather(*tasks)


def test_a_request_that_waits_past_its_queue_timeout_gets_429(model_dir: Path) -> None:
    """Streamed or not: a stream's headers wait for its first token, so it is a 429 too."""
    with ServerThread(settings(model_dir, "--queue-timeout", "0.05")) as served:
        release = hold_worker(served)
        try:
            results = asyncio.run(late_pair(served, release))
        finally:
            release.set()
        timeouts = metric(served.url, "infergrid_engine_requests_total", status="timeout")
    assert [status for status, _ in results] == [429, 429]
    assert all(int(after) >= 1 for _, after in results) and timeouts == 2


async def late_pair(served: ServerThread, release: threading.Event) -> list:
    """Two requests queued behind the held worker, released once their timeout is past."""
    async with aiohttp.ClientSession() as http:

        async def one(stream: bool) -> tuple[int, str | None]:
            body = {"prompt": "hello", "max_tokens": 3, "stream": stream, **GREEDY}
            async with http.post(served.url + "/v1/completions", json=body) as resp:
                await resp.read()
                return resp.status, resp.headers.get("Retry-After")

        tasks = [asyncio.create_task(one(stream)) for stream in (False, True)]
        engine = served.server.engine
        await asyncio.to_thread(wait_for, lambda: engine.queue_depth == 2, "2 queued")
        await asyncio.sleep(0.1)  # past the 0.05 s queue timeout
        release.set()
        return await asyncio.gather(*tasks)


def test_a_client_that_disconnects_cancels_its_request(served: ServerThread) -> None:
    engine = served.server.engine
    aborted = metric(served.url, "infergrid_engine_requests_total", status="aborted")

    async def leave_mid_stream() -> None:
        body = {"prompt": "hello", "max_tokens": 240, "stream": True, **GREEDY}
        async with aiohttp.ClientSession() as http:
            resp = await http.post(served.url + "/v1/completions", json=body)
            assert resp.status == 200
            await resp.content.readline()  # the first event: the request is running
            release = await asyncio.to_thread(hold_worker, served)
            resp.close()  # the client goes away
        await asyncio.to_thread(wait_for, lambda: engine.num_open == 0, "the handler's abort")
        release.set()

    asyncio.run(leave_mid_stream())
    wait_for(
        lambda: (
            metric(served.url, "infergrid_engine_requests_total", status="aborted") == aborted + 1
        ),
        "the abort in the metrics",
    )
    assert metric(served.url, "infergrid_engine_running_sequences") == 0
    assert metric(served.url, "infergrid_engine_kv_cache_usage_ratio") == 0


# Metrics.

METRIC_NAMES = [
    "infergrid_engine_ttft_seconds_count",
    "infergrid_engine_tpot_seconds_count",
    "infergrid_engine_inter_token_latency_seconds_count",
    "infergrid_engine_e2e_latency_seconds_count",
    "infergrid_engine_queue_time_seconds_count",
    "infergrid_engine_batch_size_count",
    "infergrid_engine_queue_depth",
    "infergrid_engine_running_sequences",
    "infergrid_engine_kv_cache_usage_ratio",
    "infergrid_engine_gpu_utilization_percent",
    "infergrid_engine_requests_total",
    "infergrid_engine_prompt_tokens_total",
    "infergrid_engine_generation_tokens_total",
    "infergrid_engine_preemptions_total",
    "infergrid_engine_prefix_cache_hit_tokens_total",
    "infergrid_engine_prefill_tokens_total",
]


def test_metrics_expose_latencies_load_and_counters(served: ServerThread) -> None:
    request(served.url + "/v1/completions", "POST", {"prompt": "hi", "max_tokens": 4, **GREEDY})
    samples = metric_samples(served.url)
    names = {name for name, _ in samples}
    assert set(METRIC_NAMES) <= names
    for latency in ("ttft", "tpot", "e2e_latency", "queue_time"):
        assert samples[(f"infergrid_engine_{latency}_seconds_count", ())] > 0
    assert samples[("infergrid_engine_requests_total", (("status", "success"),))] > 0
    assert samples[("infergrid_engine_generation_tokens_total", ())] >= 4
    assert 0 <= samples[("infergrid_engine_gpu_utilization_percent", ())] <= 100


def prefill_after_shared_system_prompt(model_dir: Path, *flags: str) -> tuple[float, float, float]:
    """(prompt tokens, computed prefill tokens, prefix-cache hit tokens) after three chats
    that share a long system prompt."""
    with ServerThread(settings(model_dir, *flags)) as served:
        for question in ("what is the capital of france?", "hello world", "the lazy dog"):
            body = {
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": question},
                ],
                "max_tokens": 2,
            }
            assert request(served.url + "/v1/chat/completions", "POST", body)[0] == 200
        samples = metric_samples(served.url)
    return tuple(
        samples[(f"infergrid_engine_{name}_total", ())]
        for name in ("prompt_tokens", "prefill_tokens", "prefix_cache_hit_tokens")
    )


def test_a_shared_system_prompt_hits_the_prefix_cache_and_computes_less(model_dir: Path) -> None:
    prompt, prefill, hits = prefill_after_shared_system_prompt(model_dir)
    assert hits >= 2 * 16  # the system prompt spans blocks; the 2nd and 3rd chat reuse them
    assert prefill == prompt - hits
    prompt_off, prefill_off, hits_off = prefill_after_shared_system_prompt(
        model_dir, "--no-prefix-caching"
    )
    assert hits_off == 0 and prefill_off == prompt_off == prompt
    assert prefill < prefill_off


def test_before_the_model_loads_only_liveness_passes() -> None:
    async def scenario() -> list[int]:
        server = EngineServer(EngineConfig(), EngineMetrics())
        site = await start_site(server, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{site.addresses[0][1]}"
        try:
            async with aiohttp.ClientSession() as http:
                statuses = []
                for method, path in [
                    ("GET", "/healthz"),
                    ("GET", "/readyz"),
                    ("POST", "/v1/completions"),
                    ("GET", "/metrics"),
                ]:
                    async with http.request(method, url + path, json={"prompt": "x"}) as resp:
                        statuses.append(resp.status)
                return statuses
        finally:
            await site.cleanup()

    assert asyncio.run(scenario()) == [200, 503, 503, 200]


def test_an_embedding_engine_embeds_and_refuses_to_generate(model_dir: Path) -> None:
    with ServerThread(settings(model_dir, "--task", "embedding")) as served:
        embedded = request(served.url + "/v1/embeddings", "POST", {"input": ["a", "b"]})
        refused = request(served.url + "/v1/completions", "POST", {"prompt": "hello"})
    assert embedded[0] == 200 and len(embedded[2]["data"]) == 2
    assert refused[0] == 400 and refused[2]["error"]["param"] == "model"


# Requests too big or too slow to be worth the server's time.

HUGE = "x" * (4 << 20)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": HUGE}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": HUGE}]}, "messages"),
        ("/v1/embeddings", {"input": ["ok", HUGE]}, "input[1]"),
    ],
)
def test_a_4_mib_prompt_is_refused_by_its_length_before_it_is_tokenized(
    model_dir: Path, path: str, body: Any, param: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ServerThread(settings(model_dir, "--max-body-bytes", str(8 << 20))) as served:
        assert served.server is not None and served.server.model is not None
        tokenizer = served.server.model.tokenizer

        def never(text: str, **_: Any) -> list[int]:
            raise AssertionError(f"tokenized {len(text)} characters")

        monkeypatch.setattr(tokenizer, "encode", never)
        status, _, doc = request(served.url + path, "POST", body)
    assert status == 400, doc
    assert doc["error"]["param"] == param and "characters" in doc["error"]["message"]


def test_liveness_answers_while_a_prompt_is_being_tokenized(
    served: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert served.server is not None and served.server.model is not None
    tokenizer = served.server.model.tokenizer
    encode, entered, release = tokenizer.encode, threading.Event(), threading.Event()

    def slow_encode(text: str, **kwargs: Any) -> list[int]:
        entered.set()
        release.wait(timeout=60)
        return encode(text, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", slow_encode)
    body = {"prompt": "hello", "max_tokens": 2, **GREEDY}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        completion = pool.submit(request, served.url + "/v1/completions", "POST", body)
        assert entered.wait(timeout=30)
        health, _, _ = request(served.url + "/healthz")
        assert not completion.done()  # still tokenizing while liveness answered
        release.set()
        status, _, doc = completion.result(timeout=60)
    assert health == 200 and status == 200, doc


async def send_slowly(port: int, first: bytes) -> bytes:
    """Send `first` and then nothing more, as a slowloris client does; all the server says
    until it closes the connection (the limit only turns a hang into a failure)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(first)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=30)
    finally:
        writer.close()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/embeddings"])
def test_a_body_slower_than_the_read_timeout_gets_a_408_and_the_connection_closes(
    model_dir: Path, path: str
) -> None:
    with ServerThread(settings(model_dir, "--read-timeout", "0.2")) as served:
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
        answer = asyncio.run(send_slowly(served.port, head.encode() + b'{"prompt": "'))
        status_line, _, rest = answer.partition(b"\r\n")
        body = json.loads(rest.partition(b"\r\n\r\n")[2])
        assert status_line.split()[1] == b"408"
        assert body["error"]["param"] == "body"
        assert request(served.url + "/healthz")[0] == 200  # the server itself is fine


def test_a_request_whose_headers_never_end_is_closed_after_the_read_timeout(
    model_dir: Path,
) -> None:
    with ServerThread(settings(model_dir, "--read-timeout", "0.2")) as served:
        answer = asyncio.run(send_slowly(served.port, b"POST /v1/completions HTTP/1.1\r\nHo"))
    assert answer == b""  # closed, without a word
