"""The gateway in front of real engine processes: what a client of the one endpoint sees."""

from __future__ import annotations

import asyncio
import json
import signal
from dataclasses import replace

import aiohttp
import openai
import pytest

from gateway.catalog import Catalog
from gateway.config import GatewayConfig
from gateway.main import drain
from gateway.tenants import KeyTable, TenantLimits
from harness.engine_process import EngineProcess
from harness.tiny_model_dir import write_tiny_model
from infergrid.constants import METRIC_GATEWAY_PENDING
from infergrid.tracks import CANARY
from tests.gateway.engines import MODEL, backend, gateway_serving, reached, route, start_engines

pytestmark = pytest.mark.timeout(300)
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
        "temperature": 0}  # fmt: skip


def two_tracks(engines, canary=10):
    return Catalog.of(route([backend(engines[0]), backend(engines[1], CANARY)], canary))


def test_the_openai_client_streams_a_chat_and_lists_the_models(engines):
    async def run():
        async with gateway_serving(two_tracks(engines)) as (_, url):
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused")
            models = await client.models.list()
            stream = await client.chat.completions.create(**CHAT, stream=True)
            pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            return [m.id for m in models.data], pieces

    models, pieces = asyncio.run(run())
    assert models == [MODEL, f"ml/{MODEL}"]  # bare where unambiguous, qualified always
    assert len(pieces) >= 2


def test_the_canary_gets_its_exact_share_counted_by_the_engines_themselves(engines):
    async def run():
        async with gateway_serving(two_tracks(engines, canary=10)) as (_, url):
            async with aiohttp.ClientSession() as http:
                before = [await reached(http, e) for e in engines]
                for _ in range(200):
                    async with http.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                        assert resp.status == 200, await resp.text()
                after = [await reached(http, e) for e in engines]
        return [a - b for a, b in zip(after, before, strict=True)]

    stable, canary = asyncio.run(run())
    assert (stable, canary) == (180, 20)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{", 400, "body"),
        (json.dumps({**CHAT, "max_token": 3}).encode(), 400, "max_token"),
        (json.dumps({**CHAT, "model": "gpt-5"}).encode(), 404, "model"),
        (b'{"model": "tiny", "messages": [], "x": "' + b"a" * 5000 + b'"}', 413, "body"),
    ],
)
def test_bad_requests_are_refused_naming_the_field_and_never_reach_an_engine(
    engines, body, status, param
):
    async def run():
        cfg = replace(GatewayConfig(), max_body_bytes=4096)
        async with gateway_serving(two_tracks(engines), cfg) as (_, url):
            async with aiohttp.ClientSession() as http:
                before = [await reached(http, e) for e in engines]
                headers = {"Content-Type": "application/json"}
                async with http.post(f"{url}/v1/chat/completions", data=body,
                                     headers=headers) as resp:  # fmt: skip
                    answer = (resp.status, await resp.json())
                after = [await reached(http, e) for e in engines]
        return answer, before, after

    (got, doc), before, after = asyncio.run(run())
    assert got == status and doc["error"]["param"] == param
    if status == 404:
        assert "served: tiny, ml/tiny" in doc["error"]["message"]
    assert before == after


def test_a_tenant_over_its_bucket_gets_429s_while_another_is_unaffected(engines):
    keys = {"sk-team-a-0123456789": TenantLimits("team-a", requests_per_s=1, burst=2),
            "sk-team-b-0123456789": TenantLimits("team-b", requests_per_s=1, burst=2)}  # fmt: skip

    async def run():
        cfg = replace(GatewayConfig(), api_keys_secret="infergrid/keys")
        async with gateway_serving(two_tracks(engines, canary=0), cfg) as (gateway, url):
            gateway.keys = KeyTable.of(keys)
            async with aiohttp.ClientSession() as http:

                async def call(key):
                    headers = {"Authorization": f"Bearer {key}"} if key else {}
                    async with http.post(f"{url}/v1/chat/completions", json=CHAT,
                                         headers=headers) as resp:  # fmt: skip
                        return resp.status, resp.headers.get("Retry-After")

                a = [await call("sk-team-a-0123456789") for _ in range(4)]
                b = [await call("sk-team-b-0123456789") for _ in range(2)]
                anonymous = await call(None)
                wrong = await call("sk-team-c-0123456789")
        return a, b, anonymous, wrong

    a, b, anonymous, wrong = asyncio.run(run())
    assert [s for s, _ in a] == [200, 200, 429, 429]
    assert all(int(r) >= 1 for _, r in a[2:])
    assert [s for s, _ in b] == [200, 200]
    assert anonymous[0] == wrong[0] == 401


def test_an_engine_killed_mid_stream_ends_the_stream_with_an_error_and_the_next_goes_elsewhere(
    engines, tmp_path
):
    doomed = start_engines(tmp_path, 1)[0]
    catalog = Catalog.of(route([backend(doomed, n=1)]))
    long = {**CHAT, "max_tokens": 1500, "ignore_eos": True, "stream": True}

    async def run():
        async with gateway_serving(catalog) as (gateway, url):
            async with aiohttp.ClientSession() as http:
                events = []
                async with http.post(f"{url}/v1/chat/completions", json=long) as resp:
                    async for line in resp.content:
                        if line.startswith(b"data: "):
                            events.append(line[6:].strip())
                            if len(events) == 3:
                                doomed.proc.send_signal(signal.SIGKILL)
                gateway.live.set(Catalog.of(route([backend(doomed, n=1),
                                                        backend(engines[0])])))  # fmt: skip
                async with http.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                    after = resp.status
        return events, after

    try:
        events, after = asyncio.run(run())
    finally:
        doomed.kill()
    last = json.loads(events[-1])
    assert last["error"]["code"] == "upstream_failed"
    assert b"[DONE]" not in events
    assert after == 200


def test_a_service_at_zero_is_asked_for_a_replica_and_answers_once_a_pod_is_ready(engines):
    asked = []

    async def run():
        async with gateway_serving(Catalog.of(route([], replicas=0))) as (gateway, url):

            async def scaler(namespace, name):
                asked.append((namespace, name))
                await asyncio.sleep(0.3)  # the pod starting
                gateway.live.set(Catalog.of(route([backend(engines[0])])))
                return True

            gateway.scaler = scaler
            async with aiohttp.ClientSession() as http:
                request = asyncio.ensure_future(http.post(f"{url}/v1/chat/completions", json=CHAT))
                await asyncio.sleep(0.1)
                pending = gateway.metrics.pending.labels("ml", "tiny")._value.get()
                async with await request as resp:
                    return pending, resp.status

    pending, status = asyncio.run(run())
    assert asked == [("ml", "tiny")]
    assert (pending, status) == (1, 200)


def test_a_held_request_times_out_with_503_and_a_full_hold_queue_answers_429(engines):
    async def run():
        cfg = replace(GatewayConfig(), hold_timeout_s=0.5, hold_queue=1)
        catalog = Catalog.of(route([], replicas=1))
        async with gateway_serving(catalog, cfg) as (gateway, url):
            async with aiohttp.ClientSession() as http:

                async def call():
                    async with http.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                        return resp.status, resp.headers.get("Retry-After")

                return await asyncio.gather(call(), call()), gateway.metrics.exposition()

    answers, exposition = asyncio.run(run())
    assert sorted(s for s, _ in answers) == [429, 503]
    assert all(r for _, r in answers)
    assert f'{METRIC_GATEWAY_PENDING}{{namespace="ml",service="tiny"}} 0.0'.encode() in exposition


def test_sigterm_drains_readiness_off_the_stream_in_flight_ends_whole(engines):
    long = {**CHAT, "max_tokens": 400, "ignore_eos": True, "stream": True}

    async def run():
        async with gateway_serving(two_tracks(engines, canary=0)) as (gateway, url):
            async with aiohttp.ClientSession() as http:
                events, seen = [], {}
                async with http.post(f"{url}/v1/chat/completions", json=long) as resp:
                    async for line in resp.content:
                        if not line.startswith(b"data: "):
                            continue
                        events.append(line[6:].strip())
                        if len(events) == 1:
                            draining = asyncio.ensure_future(drain(gateway, 60))
                            await asyncio.sleep(0.05)
                            async with http.get(f"{url}/readyz") as probe:
                                seen = {"ready": probe.status, "drained": draining.done()}
                await draining
        return events, seen

    events, seen = asyncio.run(run())
    assert seen == {"ready": 503, "drained": False}  # waiting for the stream in flight
    assert events[-1] == b"[DONE]"


def test_a_tenant_sees_and_calls_only_the_models_of_its_namespaces(engines):
    keys = {
        "sk-team-a-0123456789": TenantLimits("team-a", namespaces=frozenset({"ml"})),
        "sk-team-c-0123456789": TenantLimits("team-c", namespaces=frozenset({"c"})),
    }

    async def run():
        cfg = replace(GatewayConfig(), api_keys_secret="infergrid/keys")
        async with gateway_serving(two_tracks(engines, canary=0), cfg) as (gateway, url):
            gateway.keys = KeyTable.of(keys)
            async with aiohttp.ClientSession() as http:
                before = [await reached(http, e) for e in engines]
                seen = {}
                for key in keys:
                    headers = {"Authorization": f"Bearer {key}"}
                    async with http.get(f"{url}/v1/models", headers=headers) as resp:
                        listed = [m["id"] for m in (await resp.json())["data"]]
                    async with http.post(f"{url}/v1/chat/completions", json=CHAT,
                                         headers=headers) as resp:  # fmt: skip
                        seen[key[3:9]] = (listed, resp.status, await resp.json())
                after = [await reached(http, e) for e in engines]
        return seen, sum(after) - sum(before)

    seen, reached_engines = asyncio.run(run())
    assert seen["team-a"][:2] == ([MODEL, f"ml/{MODEL}"], 200)
    listed, status, doc = seen["team-c"]
    assert (listed, status) == ([], 404)
    assert doc["error"]["message"] == "model 'tiny' is not served; served: none"
    assert reached_engines == 1


def test_an_answer_of_many_chunks_comes_back_whole(tmp_path):
    """250 embeddings are some 350 KB, which reach the gateway in several chunks."""
    model = write_tiny_model(tmp_path / "tiny", max_positions=256)
    args = ["--model", str(model), "--model-name", MODEL, "--task", "embedding",
            "--cpu-threads", "1"]  # fmt: skip
    engine = EngineProcess(args, tmp_path / "engine.log")
    body = {"model": MODEL, "input": [f"text {i}" for i in range(250)]}

    async def run():
        catalog = Catalog.of(route([backend(engine)]))
        async with gateway_serving(catalog) as (_, url), aiohttp.ClientSession() as http:
            async with http.post(f"{engine.url}/v1/embeddings", json=body) as resp:
                direct = await resp.read()
            async with http.post(f"{url}/v1/embeddings", json=body) as resp:
                return direct, resp.status, await resp.read()

    try:
        engine.wait_ready()
        direct, status, through = asyncio.run(run())
    finally:
        engine.kill()
    assert len(direct) > 256 * 1024
    assert status == 200
    assert len(json.loads(through)["data"]) == 250
    assert json.loads(through)["data"] == json.loads(direct)["data"]


def test_a_stream_pays_what_the_real_engine_reports_and_a_client_that_declined_usage_sees_none(
    engines,
):
    """The gateway asks the engine for the usage chunk by appending `stream_options`, which
    the engine's parser takes over the client's own (the last of a repeated key wins)."""
    keys = {"sk-team-a-0123456789": TenantLimits("team-a", tokens_per_minute=10_000)}
    body = {**CHAT, "max_tokens": 8, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": False}}  # fmt: skip

    async def run():
        cfg = replace(GatewayConfig(), api_keys_secret="infergrid/keys")
        async with gateway_serving(two_tracks(engines, canary=0), cfg) as (gateway, url):
            gateway.keys = KeyTable.of(keys)
            gateway.clock = lambda: 0.0
            headers = {"Authorization": "Bearer sk-team-a-0123456789"}
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{url}/v1/chat/completions", json=body,
                                     headers=headers) as resp:  # fmt: skip
                    events = [line[6:].strip() async for line in resp.content
                              if line.startswith(b"data: ")]  # fmt: skip
                asked = {**CHAT, "max_tokens": 8, "ignore_eos": True}  # the same, whole
                async with http.post(f"{engines[0].url}/v1/chat/completions",
                                     json=asked) as resp:  # fmt: skip
                    reported = (await resp.json())["usage"]["total_tokens"]
            bucket = gateway.admission.tenants["team-a"].tokens
            return events, reported, bucket.level

    events, reported, level = asyncio.run(run())
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == b"[DONE]"
    assert all(c["choices"] and "usage" not in c for c in chunks)
    assert level == 10_000 - reported  # the same prompt, and 8 tokens, as asked directly
