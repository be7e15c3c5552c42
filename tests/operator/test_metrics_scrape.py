"""Reading the engines' /metrics (bounded, off the event loop) into a service's load with P99
per interval, and the gateway's /metrics into the requests it holds for a service."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from aiohttp import web

from inference_operator import metrics_scrape
from inference_operator.config import DEFAULT_METRICS_URL
from inference_operator.metrics_scrape import (
    OVER_CAP,
    MetricsUnreadable,
    ScrapeRound,
    aggregate,
    gateway_pending,
    histogram_quantile,
    latency_delta,
    parse_bodies,
    parse_gateway_pending,
    scrapable,
    scrape,
    scrape_url,
)
from infergrid.constants import METRIC_GATEWAY_PENDING
from infergrid.engine_metrics import MAX_METRICS_BYTES, parse_engine_metrics
from infergrid.runtimes import RUNTIMES
from tests.test_engine_metrics import engine_text


def test_p99_interpolates_inside_its_bucket():
    buckets = ((0.1, 50.0), (0.5, 100.0), (float("inf"), 100.0))
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.1 + 0.4 * 49 / 50)
    assert histogram_quantile(0.99, ()) is None
    assert histogram_quantile(0.99, ((0.1, 0.0), (float("inf"), 0.0))) is None


def test_p99_in_the_overflow_bucket_is_the_largest_bound():
    buckets = ((0.1, 1.0), (2.5, 1.0), (float("inf"), 100.0))
    assert histogram_quantile(0.99, buckets) == 2.5


def test_latency_counts_only_since_the_previous_scrape():
    before = parse_engine_metrics(engine_text(latencies=[2.0] * 100)).latency
    now = parse_engine_metrics(engine_text(latencies=[2.0] * 100 + [0.07] * 50)).latency
    delta = dict(latency_delta(now, before))
    assert delta[0.1] == 50 and delta[float("inf")] == 50
    assert latency_delta(now, None) == ()


def test_a_restarted_engine_counts_from_zero():
    before = ((0.1, 10.0), (float("inf"), 10.0))
    now = ((0.1, 2.0), (float("inf"), 3.0))
    assert latency_delta(now, before) == now


def test_aggregate_means_over_pods_and_p99_over_their_new_requests():
    first = {
        "a": parse_engine_metrics(engine_text(queue=2, gpus=(40,), latencies=[0.07] * 10)),
        "b": parse_engine_metrics(engine_text(queue=6, gpus=(80,), latencies=[0.07] * 10)),
    }
    assert aggregate(first, {}).p99_latency_ms is None  # no interval yet
    later = {
        "a": parse_engine_metrics(engine_text(queue=2, gpus=(40,), latencies=[0.07] * 110)),
        "b": parse_engine_metrics(engine_text(queue=6, gpus=(80,),
                                              latencies=[0.07] * 10 + [2.0] * 5)),
    }  # fmt: skip
    metrics = aggregate(later, {pod: s.latency for pod, s in first.items()})
    assert metrics.pods == 2
    assert metrics.queue_depth == 4
    assert metrics.gpu_utilization == 60
    # 100 fast requests on a, 5 slow ones on b: the 99th percentile is a slow one.
    assert metrics.p99_latency_ms == pytest.approx(1000 + 1500 * (103.95 - 100) / 5)


def test_the_url_template_names_the_pod_and_its_runtimes_port():
    pod = {"metadata": {"name": "chat-1", "namespace": "ns"}, "status": {"podIP": "10.1.2.3"}}
    assert scrape_url(DEFAULT_METRICS_URL, pod, 8000) == "http://10.1.2.3:8000/metrics"
    assert scrape_url(DEFAULT_METRICS_URL, pod, 30000) == "http://10.1.2.3:30000/metrics"
    assert scrape_url("http://127.0.0.1:9/{namespace}/{pod_name}", pod, 8000) == (
        "http://127.0.0.1:9/ns/chat-1"
    )


def test_a_runtimes_own_series_are_read_as_the_engines():
    body = b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 12\n"
    samples, unreadable = parse_bodies({"p": body}, RUNTIMES["vllm"].metrics)
    assert (samples["p"].queue_depth, unreadable) == (12, {})
    assert parse_bodies({"p": body})[0]["p"].queue_depth is None  # not the bundled engine's


def test_running_pods_with_an_address_are_scraped_ready_or_not():
    def pod(phase="Running", ip="10.0.0.1", deleting=False):
        meta = {"name": "p", "namespace": "ns"}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {"metadata": meta, "status": {"phase": phase, "podIP": ip}}

    assert scrapable(pod())
    assert not scrapable(pod(phase="Pending", ip=None))
    assert not scrapable(pod(ip=None))
    assert not scrapable(pod(deleting=True))


def test_scrape_reads_pods_concurrently_and_leaves_out_the_silent_ones(unused_tcp_port):
    async def metrics(request: web.Request) -> web.Response:
        if request.match_info["pod"] == "broken":
            return web.Response(text="{garbage\n")
        if request.match_info["pod"] == "missing":
            return web.Response(status=404)
        return web.Response(text=engine_text(queue=5))

    async def run() -> ScrapeRound:
        app = web.Application()
        app.router.add_get("/{pod}", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
        try:
            base = f"http://127.0.0.1:{unused_tcp_port}"
            urls = {p: f"{base}/{p}" for p in ("good", "broken", "missing")}
            urls["closed"] = "http://127.0.0.1:1/metrics"
            return await scrape(urls, timeout_s=2)
        finally:
            await runner.cleanup()

    scraped = asyncio.run(run())
    assert list(scraped.samples) == ["good"]
    assert scraped.samples["good"].queue_depth == 5
    assert list(scraped.ignored) == ["broken"]  # answered, unusably; the silent ones may start
    assert scraped.ignored["broken"].startswith("/metrics is not Prometheus text: ")


async def serve_and_scrape(port: int, bodies: dict[str, bytes]) -> ScrapeRound:
    """Scrapes each pod's body from a real local HTTP server; chunked when marked so, which
    gives no Content-Length to go by."""

    async def metrics(request: web.Request) -> web.StreamResponse:
        pod = request.match_info["pod"]
        response = web.StreamResponse()
        if pod.startswith("chunked"):
            response.enable_chunked_encoding()
        else:
            response.content_length = len(bodies[pod])
        await response.prepare(request)
        for start in range(0, len(bodies[pod]), 65536):
            await response.write(bodies[pod][start : start + 65536])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/{pod}", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        return await scrape({p: f"http://127.0.0.1:{port}/{p}" for p in bodies}, timeout_s=5)
    finally:
        await runner.cleanup()


def test_a_metrics_body_over_the_cap_is_a_failed_scrape_and_others_still_count(
    unused_tcp_port, caplog
):
    normal = engine_text(queue=4).encode()
    padding = b"# padding\n" * (2 * MAX_METRICS_BYTES // 10)  # 2 MiB of valid comments
    bodies = {"normal": normal, "huge": normal + padding, "chunked-huge": normal + padding}
    with caplog.at_level(logging.WARNING, logger="infergrid.operator.metrics"):
        scraped = asyncio.run(serve_and_scrape(unused_tcp_port, bodies))
    assert list(scraped.samples) == ["normal"]
    assert scraped.samples["normal"].queue_depth == 4
    assert scraped.ignored == {pod: OVER_CAP for pod in ("huge", "chunked-huge")}
    refused = [r.getMessage() for r in caplog.records if "cap" in r.getMessage()]
    assert sorted(refused) == sorted(
        f"pod {pod}: /metrics is over the {MAX_METRICS_BYTES}-byte cap; scrape counted as failed"
        for pod in ("huge", "chunked-huge")
    )


def test_a_body_just_under_the_cap_parses_as_before(unused_tcp_port):
    normal = engine_text(queue=2, latencies=(0.2,)).encode()
    body = normal + b"#" * (MAX_METRICS_BYTES - len(normal) - 1) + b"\n"
    scraped = asyncio.run(serve_and_scrape(unused_tcp_port, {"chunked-full": body}))
    assert scraped.samples["chunked-full"] == parse_engine_metrics(normal.decode())
    assert scraped.ignored == {}


def test_a_body_that_is_not_utf8_is_left_out_not_raised(unused_tcp_port):
    scraped = asyncio.run(serve_and_scrape(unused_tcp_port, {"binary": b"\xff\xfe\x00"}))
    assert scraped.samples == {}
    assert scraped.ignored["binary"].startswith("/metrics is not Prometheus text: ")


def test_parsing_runs_off_the_event_loop(unused_tcp_port, monkeypatch):
    threads = []

    def recording(text: str, names):
        threads.append(threading.current_thread())
        return parse_engine_metrics(text, names)

    monkeypatch.setattr(metrics_scrape, "parse_engine_metrics", recording)
    body = engine_text().encode()
    scraped = asyncio.run(serve_and_scrape(unused_tcp_port, {"normal": body}))
    assert list(scraped.samples) == ["normal"]
    assert threads and threads[0] is not threading.main_thread()


def gateway_text(*series: tuple[str, str, float]) -> str:
    """The gateway's /metrics: one pending-requests series per (namespace, service, count)."""
    lines = [f"# TYPE {METRIC_GATEWAY_PENDING} gauge"]
    lines += [f'{METRIC_GATEWAY_PENDING}{{namespace="{ns}",service="{svc}"}} {count}'
              for ns, svc, count in series]  # fmt: skip
    return "\n".join(lines) + "\n"


def test_the_gateways_pending_requests_are_read_for_one_service():
    text = gateway_text(("ml", "chat", 3), ("ml", "embed", 7), ("other", "chat", 11))
    assert parse_gateway_pending(text, "ml", "chat") == 3
    assert parse_gateway_pending(text, "other", "chat") == 11


def test_no_series_for_the_service_is_no_pending_request():
    assert parse_gateway_pending(gateway_text(("ml", "embed", 7)), "ml", "chat") == 0
    assert parse_gateway_pending(engine_text(), "ml", "chat") == 0
    assert parse_gateway_pending("", "ml", "chat") == 0


def test_the_series_of_several_gateway_replicas_are_summed():
    repeated = gateway_text(("ml", "chat", 2), ("ml", "chat", 3))
    assert parse_gateway_pending(repeated, "ml", "chat") == 5
    labelled = "".join(
        f'{METRIC_GATEWAY_PENDING}{{namespace="ml",service="chat",pod="{pod}"}} {count}\n'
        for pod, count in (("gw-a", 2), ("gw-b", 4))
    )
    assert parse_gateway_pending(labelled, "ml", "chat") == 6


@pytest.mark.parametrize(
    "text",
    ["{garbage\n", gateway_text(("ml", "chat", float("nan"))), gateway_text(("ml", "chat", -1))],
)
def test_gateway_text_that_is_no_count_is_a_value_error(text):
    with pytest.raises(ValueError):
        parse_gateway_pending(text, "ml", "chat")


async def serve_gateway(port: int, url_path: str, answers: dict[str, tuple[int, bytes]]) -> float:
    """gateway_pending of ml/chat, from a real local HTTP server answering each path."""

    async def metrics(request: web.Request) -> web.Response:
        status, body = answers[request.match_info["path"]]
        return web.Response(status=status, body=body)

    app = web.Application()
    app.router.add_get("/{path}", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        return await gateway_pending(f"http://127.0.0.1:{port}/{url_path}", "ml", "chat", 2)
    finally:
        await runner.cleanup()


ANSWERS = {
    "metrics": (200, gateway_text(("ml", "chat", 2)).encode()),
    "missing": (404, b"not found"),
    "huge": (200, gateway_text(("ml", "chat", 2)).encode() + b"# pad\n" * (MAX_METRICS_BYTES // 3)),
    "garbage": (200, b"{garbage\n"),
    "binary": (200, b"\xff\xfe\x00"),
}


def test_the_gateway_is_read_over_http(unused_tcp_port):
    assert asyncio.run(serve_gateway(unused_tcp_port, "metrics", ANSWERS)) == 2


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("missing", "HTTP status 404"),
        ("huge", OVER_CAP),
        ("garbage", "unusable: "),
        ("binary", "unusable: "),
    ],
)
def test_a_gateway_answer_that_gives_no_count_is_unreadable(unused_tcp_port, path, reason):
    with pytest.raises(MetricsUnreadable, match=f"^{reason}"):
        asyncio.run(serve_gateway(unused_tcp_port, path, ANSWERS))


def test_a_gateway_that_does_not_answer_is_unreadable():
    with pytest.raises(MetricsUnreadable, match="^no answer: "):
        asyncio.run(gateway_pending("http://127.0.0.1:1/metrics", "ml", "chat", 2))


@pytest.fixture()
def unused_tcp_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def scrape_a_redirecting_pod(port: int) -> tuple[ScrapeRound, list[str], str]:
    """A tenant's pod whose /metrics redirects to another address it wants read for it (a
    cloud's metadata service, another tenant's engine), here a path of the same server that
    records each hit; and the gateway's /metrics redirecting the same way."""
    hits: list[str] = []

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"http://127.0.0.1:{port}/secret")

    async def secret(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(text=engine_text(queue=9))

    app = web.Application()
    app.router.add_get("/metrics", redirect)
    app.router.add_get("/secret", secret)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        scraped = await scrape({"tenant": f"http://127.0.0.1:{port}/metrics"}, timeout_s=2)
        try:
            await gateway_pending(f"http://127.0.0.1:{port}/metrics", "ml", "chat", 2)
        except MetricsUnreadable as err:
            refused = str(err)
        return scraped, hits, refused
    finally:
        await runner.cleanup()


def test_a_scrape_never_follows_a_redirect(unused_tcp_port):
    scraped, hits, refused = asyncio.run(scrape_a_redirecting_pod(unused_tcp_port))
    assert hits == []
    assert scraped.samples == {} and scraped.ignored == {}  # as a pod that did not answer
    assert refused == "HTTP status 307"


@pytest.mark.parametrize("body", [b"stolen_token s3cr3t-of-another-tenant\n", b"s3cr3t\xff\xfe"])
def test_no_byte_of_an_unusable_body_reaches_the_reason_an_event_carries(unused_tcp_port, body):
    scraped = asyncio.run(serve_and_scrape(unused_tcp_port, {"tenant": body}))
    (reason,) = scraped.ignored.values()
    assert reason.startswith("/metrics is not Prometheus text: ")
    assert "s3cr3t" not in reason and "token" not in reason
