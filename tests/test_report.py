"""`infergrid report` on hand-made recordings: GPU-hours held against the whole-GPU
counterfactual and against GPU-hours used, tokens per GPU-hour and cost, per namespace, service
and GPU model; bad input named; read from a real HTTP Prometheus stand-in that never gets
followed through a redirect; and the HTML page opened in a real headless browser, whose DOM
shows the report's numbers."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infergrid.cli import main
from infergrid.errors import ContractError
from infergrid.fleet import load_fleet
from infergrid.report import (
    compute_report,
    load_prices,
    read_prometheus,
    render_html,
    render_table,
    report_from_recording,
    to_json,
)
from infergrid.report.columns import COLUMNS, SAVINGS
from infergrid.report.prices import parse_prices
from infergrid.report.rows import Report, Row
from infergrid.report.series import HELD, SCHEMA, TOKENS, UTILIZATION, parse_recording

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000
HOUR = 3600
STEP = 60
H100 = "NVIDIA H100 80GB HBM3"
L4 = "NVIDIA L4"
A100 = "NVIDIA A100-SXM4-80GB"


# --- hand-made recordings: what Prometheus' query_range answers, saved --------------------


def samples(value: float, start: int = 0, end: int = HOUR) -> list[list[Any]]:
    """A steady value sampled every step from ``start`` to ``end`` seconds into the window."""
    return [[T0 + t, repr(value)] for t in range(start, end + 1, STEP)]


def held(pod: str, gpu: str, ratio: float, model: str = L4, **more: Any) -> dict[str, Any]:
    """A container's held-ratio series, as the device plugin exports it."""
    labels = {"__name__": HELD, "node": "n1", "gpu_uuid": gpu, "model": model, "mig_uuid": "",
              "namespace": "team", "pod": pod, "container": "engine"}  # fmt: skip
    span = {k: more.pop(k) for k in ("start", "end") if k in more}
    return {"metric": {**labels, **more}, "values": samples(ratio, **span)}


def utilization(gpu: str, percent: float, model: str = L4) -> dict[str, Any]:
    labels = {"__name__": UTILIZATION, "node": "n1", "gpu_uuid": gpu, "model": model}
    return {"metric": labels, "values": samples(percent)}


def tokens(pod: str, service: str, values: list[tuple[int, float]], namespace: str = "team"):
    """An engine's generation-token counter, with the labels the engines ServiceMonitor adds."""
    labels = {"__name__": TOKENS, "namespace": namespace, "pod": pod, "inferenceservice": service,
              "track": "main", "job": "engines"}  # fmt: skip
    return {"metric": labels, "values": [[T0 + t, repr(v)] for t, v in values]}


def recording(*series: dict[str, Any]) -> dict[str, Any]:
    return {"schema": SCHEMA, "start": T0, "end": T0 + HOUR, "step": STEP, "series": list(series)}


def report_of(doc: dict[str, Any], prices: dict[str, float] | None = None) -> Report:
    table = load_prices() if prices is None else parse_prices(prices, "prices", "test")
    return compute_report(parse_recording(doc, "recording"), table)


def only_row(report: Report, **match: str) -> Row:
    (row,) = [r for r in report.rows if all(getattr(r, k) == v for k, v in match.items())]
    return row


# --- what each column means ------------------------------------------------------------------


def test_a_pod_holding_a_whole_gpu_all_hour_holds_one_gpu_hour_and_uses_its_utilisation():
    report = report_of(recording(held("big-0", "GPU-a", 1.0, H100), utilization("GPU-a", 40, H100)))
    row = only_row(report, model=H100)
    assert (row.held_gpu_hours, row.whole_gpu_hours) == pytest.approx((1.0, 1.0))
    assert row.used_gpu_hours == pytest.approx(0.4)
    assert row.utilization_pct == pytest.approx(40.0)
    assert row.saved_gpu_hours == pytest.approx(0.0)


def test_four_quarter_shares_of_one_gpu_hold_one_gpu_hour_where_whole_gpus_would_hold_four():
    shares = [held(f"small-{i}", "GPU-b", 0.25) for i in range(4)]
    report = report_of(recording(*shares, utilization("GPU-b", 80)))
    row = only_row(report, model=L4)
    assert row.pods == 4
    assert row.held_gpu_hours == pytest.approx(1.0)
    assert row.whole_gpu_hours == pytest.approx(4.0)
    # The GPU's 80% is split among its holders by held ratio: 0.2 GPU-hours used each.
    assert row.used_gpu_hours == pytest.approx(0.8)
    assert row.utilization_pct == pytest.approx(80.0)
    assert (report.total.saved_gpu_hours, report.total.saved_pct) == pytest.approx((3.0, 75.0))
    point = report.timeline[10]
    assert (point.held_gpus, point.whole_gpus, point.used_gpus) == pytest.approx((1.0, 4.0, 0.8))


def test_a_mig_slice_holds_its_memory_share_would_need_a_whole_gpu_and_reports_no_utilisation():
    # Two 1g.10gb instances of one A100 80GB, in two pods; in MIG mode NVML reads no utilisation.
    slices = [held(f"mig-{i}", "GPU-c", 0.125, A100, mig_uuid=f"MIG-{i}") for i in range(2)]
    row = only_row(report_of(recording(*slices)), model=A100)
    assert row.held_gpu_hours == pytest.approx(0.25)
    assert row.whole_gpu_hours == pytest.approx(2.0)
    assert (row.measured_gpu_hours, row.utilization_pct) == (0.0, None)
    (shown,) = [c.shown(row) for c in COLUMNS if c.key == "utilization_pct"]
    assert shown == "-"


def test_a_pod_of_several_whole_gpus_needs_as_many_and_its_containers_on_one_gpu_need_one():
    pod = [held("tp-0", gpu, 1.0, H100) for gpu in ("GPU-1", "GPU-2")]
    sidecar = held("share-0", "GPU-3", 0.5, container="engine")
    sidecar_too = held("share-0", "GPU-3", 0.25, container="sidecar")
    report = report_of(recording(*pod, sidecar, sidecar_too))
    assert only_row(report, model=H100).whole_gpu_hours == pytest.approx(2.0)
    row = only_row(report, model=L4)
    assert (row.held_gpu_hours, row.whole_gpu_hours) == pytest.approx((0.75, 1.0))


def test_a_pod_that_came_and_went_mid_window_counts_only_the_steps_it_was_seen():
    # Seen from 15 min to 44 min: 30 one-minute steps, half an hour, inside a one-hour window.
    visitor = held("visitor-0", "GPU-a", 1.0, start=15 * 60, end=44 * 60)
    counted = tokens(
        "visitor-0", "chat", [(t, 100.0 + 10 * (t - 900)) for t in range(900, 2641, 60)]
    )
    report = report_of(recording(visitor, counted))
    row = only_row(report, service="chat")
    assert (row.held_gpu_hours, row.whole_gpu_hours) == pytest.approx((0.5, 0.5))
    # Its counter began inside the window, so its first value counts from 0.
    assert row.tokens == pytest.approx(100 + 10 * (2640 - 900))
    held_at = {round(p.time) - T0: p.held_gpus for p in report.timeline}
    assert (held_at[14 * 60], held_at[15 * 60], held_at[44 * 60], held_at[45 * 60]) == (0, 1, 1, 0)
    assert len(report.timeline) == HOUR // STEP


def test_tokens_per_gpu_hour_count_a_counter_through_its_restarts():
    # 0 -> 1000, the engine restarts (the counter drops to 200), then 200 -> 500: 1500 tokens.
    counter = [(0, 0.0), (1200, 1000.0), (1260, 200.0), (HOUR, 500.0)]
    doc = recording(held("chat-0", "GPU-b", 0.5), tokens("chat-0", "chat", counter))
    row = only_row(report_of(doc), service="chat")
    assert row.tokens == pytest.approx(1500)
    assert row.tokens_per_gpu_hour == pytest.approx(3000)


def test_pods_map_to_services_from_engine_series_and_the_rest_go_under_service_dash():
    doc = recording(
        held("chat-0", "GPU-a", 1.0),
        held("batch-job", "GPU-b", 1.0),
        tokens("chat-0", "chat", [(0, 0.0), (HOUR, 60.0)]),
        tokens("cpu-0", "embed", [(0, 0.0), (HOUR, 30.0)], namespace="other"),
    )
    report = report_of(doc)
    keys = [(r.namespace, r.service, r.model) for r in report.rows]
    assert keys == [("other", "embed", "-"), ("team", "-", L4), ("team", "chat", L4)]
    assert only_row(report, service="embed").tokens_per_gpu_hour is None  # held no GPU
    assert report.total.tokens == pytest.approx(90)
    assert 'service "-": pods that held a GPU and have no engine series' in render_table(report)


def test_cost_comes_from_the_price_table_and_unnamed_models_pay_the_default():
    doc = recording(
        *(held(f"s-{i}", "GPU-b", 0.25) for i in range(4)),
        held("a10-0", "GPU-x", 1.0, model="NVIDIA A10"),
    )
    report = report_of(doc, prices={"default": 3.0, L4: 1.5})
    l4 = only_row(report, model=L4)
    assert (l4.price_per_gpu_hour, l4.cost_held, l4.cost_whole) == pytest.approx((1.5, 1.5, 6.0))
    a10 = only_row(report, model="NVIDIA A10")
    assert (a10.price_per_gpu_hour, a10.cost_held, a10.cost_whole) == pytest.approx((3, 3, 3))
    assert (report.total.cost_held, report.total.saved_cost) == pytest.approx((4.5, 4.5))
    assert "priced at the default $3.00: NVIDIA A10" in render_table(report)


def test_the_built_in_price_table_prices_every_model_of_the_local_fleets_by_name():
    prices = load_prices()
    models = {
        gpu.model
        for fleet in (ROOT / "e2e" / "fleets").glob("*.yaml")
        for node in load_fleet(fleet).nodes
        for gpu in node.inventory.gpus
    }
    assert models and all(prices.names(m) for m in models), models - set(prices.per_model)
    assert 0 < prices.price("some future GPU") == prices.default


def test_the_series_read_are_the_ones_the_device_plugin_and_the_engine_export():
    from prometheus_client import generate_latest

    from batching_engine.metrics import EngineMetrics
    from device_plugin.metrics import GPU_HELD, GPU_UTILIZATION

    assert (GPU_HELD._name, GPU_UTILIZATION._name) == (HELD, UTILIZATION)
    exposed = generate_latest(EngineMetrics().registry).decode()
    assert f"\n{TOKENS} " in exposed


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 5), st.sampled_from([0.125, 0.25, 0.5, 1.0]),
                  st.integers(0, 100)),
        min_size=1, max_size=12,
    )
)  # fmt: skip
def test_whole_gpus_never_hold_less_than_shares_and_use_never_exceeds_holding(holdings):
    # (GPU, pod, ratio, utilisation %): a pod's containers on one GPU hold at most all of it.
    series, seen = [], set()
    for gpu, pod, ratio, _ in holdings:
        if (gpu, pod) not in seen:
            seen.add((gpu, pod))
            series.append(held(f"p{pod}", f"GPU-{gpu}", ratio))
    series += [utilization(f"GPU-{gpu}", pct) for gpu, pct in {(g, u) for g, _, _, u in holdings}]
    total = report_of(recording(*series)).total
    assert total.whole_gpu_hours >= total.held_gpu_hours - 1e-9
    assert total.used_gpu_hours <= total.measured_gpu_hours + 1e-9
    assert total.whole_gpu_hours == pytest.approx(len(seen))


# --- bad input, named ------------------------------------------------------------------------


def _set(path: str, value: Any):
    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        target = doc
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if value is KeyError:
            del target[last]
        else:
            target[int(last) if isinstance(target, list) else last] = value

    return change


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (_set("schema", "infergrid.io/report-series/v9"), "recording.schema"),
        (_set("step", KeyError), "recording.step"),
        (_set("step", 0), "recording.step"),
        (_set("end", T0), "recording.end"),
        (_set("start", "yesterday"), "recording.start"),
        (_set("series/0/values/1", [T0 + 60]), "recording.series[0].values[1]"),
        (_set("series/0/values/1/1", "lots"), "recording.series[0].values[1][1]"),
        (_set("series/0/values/1/1", "NaN"), "recording.series[0].values[1][1]"),
        (_set("series/0/values/1/0", T0 + 2 * HOUR), "recording.series[0].values[1][0]"),
        (_set("series/0/values/2/0", T0 + 60), "recording.series[0].values[2][0]"),
        (_set("series/0/metric/pod", 7), "recording.series[0].metric.pod"),
        (_set("series/0/metric/pod", KeyError), "recording.series[0].metric.pod"),
        (_set("series/0/metric/gpu_uuid", ""), "recording.series[0].metric.gpu_uuid"),
        (_set("series/0/points", []), "recording.series[0].points"),
    ],
)
def test_a_bad_recording_is_refused_naming_the_field(change, field):
    doc = recording(held("p-0", "GPU-a", 1.0))
    change(doc)
    with pytest.raises(ContractError) as refused:
        report_of(doc)
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("prices", "field"),
    [({L4: 1.0}, "prices.default"), ({"default": -1}, "prices.default"),
     ({"default": 1, L4: "cheap"}, "prices[NVIDIA L4]"), (["default"], "prices")],
)  # fmt: skip
def test_a_bad_price_table_is_refused_naming_the_field(prices, field):
    with pytest.raises(ContractError) as refused:
        parse_prices(prices, "prices", "test")
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--recorded", "{rec}", "--window", "1h"], "error: window:"),
        (["--recorded", "{rec}", "--prices", "{missing}"], "error: {missing}: cannot read"),
        (["--recorded", "{missing}"], "error: {missing}: cannot read"),
        (["--prometheus", "http://127.0.0.1:9", "--window", "1x"], "error: window:"),
        (["--prometheus", "http://127.0.0.1:9", "--step", "0s"], "error: step:"),
        (["--prometheus", "http://127.0.0.1:9", "--window", "1h", "--start", "0"],
         "error: window:"),
        (["--prometheus", "http://127.0.0.1:9", "--start", "2025-06-01T00:00:00"], "error: start:"),
        (["--prometheus", "http://127.0.0.1:9", "--start", "10", "--end", "5"], "error: end:"),
        (["--prometheus", "http://127.0.0.1:9", "--window", "30d", "--step", "1s"], "error: step:"),
        (["--prometheus", "ftp://example", "--window", "1h"], "error: prometheus:"),
        (["--prometheus", "http://127.0.0.1:9", "--window", "1h"],
         "error: prometheus: cannot reach http://127.0.0.1:9/api/v1/query_range"),
        (["--recorded", "{rec}", "--html", "{tmp}/no/such/dir/r.html"], "error: html:"),
    ],
)  # fmt: skip
def test_bad_flags_exit_2_naming_the_field(flags, named, tmp_path, capsys):
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps(recording(held("p-0", "GPU-a", 1.0))))
    names = {"rec": rec, "missing": tmp_path / "missing", "tmp": tmp_path}
    assert main(["report", *(f.format(**names) for f in flags)]) == 2
    assert capsys.readouterr().err.startswith(named.format(**names))


# --- the Prometheus edge, over real HTTP ----------------------------------------------------


class FakePrometheus(BaseHTTPRequestHandler):
    """Answers /api/v1/query_range from a recording, as Prometheus would for a bare metric
    name; ``redirect`` makes every answer a 302 instead."""

    source: dict[str, Any] = {}
    redirect: str | None = None
    asked: list[str] = []

    def do_GET(self) -> None:
        self.asked.append(self.path)
        url = urllib.parse.urlsplit(self.path)
        if self.redirect:
            self.send_response(302)
            self.send_header("Location", self.redirect)
            self.end_headers()
            return
        if url.path != "/api/v1/query_range":
            self._answer(404, {"status": "error", "error": "not found"})
            return
        query = urllib.parse.parse_qs(url.query)
        if query["query"] == ["bad"]:
            self._answer(400, {"status": "error", "errorType": "bad_data", "error": "parse error"})
            return
        start, end = float(query["start"][0]), float(query["end"][0])
        result = [
            {"metric": s["metric"], "values": [v for v in s["values"] if start <= v[0] <= end]}
            for s in self.source["series"]
            if s["metric"]["__name__"] == query["query"][0]
        ]
        self._answer(200, {"status": "success", "data": {"resultType": "matrix", "result": result}})

    def _answer(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[tuple[str, type[FakePrometheus]]]:
    handler = type("Handler", (FakePrometheus,), {"asked": [], "redirect": None})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def fleet_recording() -> dict[str, Any]:
    """A small fleet: a whole H100 for one service, an L4 shared four ways by another, and a
    MIG slice with no engine series."""
    return recording(
        held("llama-0", "GPU-a", 1.0, H100),
        utilization("GPU-a", 55, H100),
        *(held(f"chat-{i}", "GPU-b", 0.25) for i in range(4)),
        utilization("GPU-b", 70),
        held("notebook", "GPU-c", 0.125, A100, mig_uuid="MIG-0", namespace="lab"),
        tokens("llama-0", "llama", [(0, 0.0), (HOUR, 90000.0)]),
        *(tokens(f"chat-{i}", "chat", [(0, 0.0), (HOUR, 5000.0 * (i + 1))]) for i in range(4)),
    )


def test_the_report_read_from_prometheus_is_the_report_of_its_recording(
    prometheus, tmp_path, capsys
):
    url, handler = prometheus
    handler.source = fleet_recording()
    record = tmp_path / "run.json"
    window = ["--start", str(T0), "--end", "2023-11-14T23:13:20Z", "--step", "1m"]
    assert main(["report", "--prometheus", url, *window, "--json", "--record", str(record)]) == 0
    live = json.loads(capsys.readouterr().out)
    assert main(["report", "--recorded", str(record), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == live
    assert live == to_json(report_of(fleet_recording()))
    asked = [urllib.parse.parse_qs(urllib.parse.urlsplit(p).query) for p in handler.asked]
    assert sorted(q["query"][0] for q in asked) == sorted([HELD, UTILIZATION, TOKENS])
    window_asked = {tuple(float(q[k][0]) for k in ("start", "end", "step")) for q in asked}
    assert window_asked == {(T0, T0 + HOUR, STEP)}


def test_a_redirect_from_prometheus_is_refused_not_followed(prometheus):
    url, handler = prometheus
    handler.redirect = f"{url}/elsewhere"
    with pytest.raises(ContractError) as refused:
        read_prometheus(url, T0, T0 + HOUR, STEP)
    assert refused.value.field == "prometheus"
    assert f"{url}/api/v1/query_range answered 302, a redirect to {url}/elsewhere" in str(
        refused.value
    )
    assert "not followed" in str(refused.value)
    assert not any(p.startswith("/elsewhere") for p in handler.asked)


def test_prometheus_errors_are_shown_with_the_url(prometheus):
    from infergrid.report.prometheus import query_range

    url, _ = prometheus
    with pytest.raises(ContractError, match=r"query_range answered 400 Bad Request: parse error"):
        query_range(url, "bad", T0, T0 + HOUR, STEP)
    with pytest.raises(ContractError, match=r"answered 404"):
        read_prometheus(f"{url}/no/prefix/here", T0, T0 + HOUR, STEP)


# --- the page, in a real browser ---------------------------------------------------------


class Dom(HTMLParser):
    """The dumped DOM as nested elements: (tag, attributes, children, own text)."""

    VOID = {"meta", "link", "br", "img", "input", "hr", "col", "source"}

    def __init__(self, page: str) -> None:
        super().__init__()
        self.root: dict[str, Any] = {"tag": "", "attrs": {}, "children": [], "text": ""}
        self.open = [self.root]
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = {"tag": tag, "attrs": dict(attrs), "children": [], "text": ""}
        self.open[-1]["children"].append(node)
        if tag not in self.VOID:
            self.open.append(node)

    def handle_endtag(self, tag: str) -> None:
        while len(self.open) > 1 and self.open.pop()["tag"] != tag:
            pass

    def handle_data(self, data: str) -> None:
        self.open[-1]["text"] += data

    def all(self, node: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        for child in (node or self.root)["children"]:
            yield child
            yield from self.all(child)

    def find(self, tag: str, node: dict[str, Any] | None = None, **attrs: str) -> list[dict]:
        """The elements ``tag`` under ``node`` having each of ``attrs`` (a class among theirs;
        ``class_`` is ``class``)."""
        return [
            n for n in self.all(node)
            if n["tag"] == tag
            and all(v in (n["attrs"].get(k.rstrip("_")) or "").split() for k, v in attrs.items())
        ]  # fmt: skip


def browser_dom(page: Path) -> Dom:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH: `apt-get install chromium` (make test installs it)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--user-data-dir={page.parent / 'chromium-profile'}", "--dump-dom"]  # fmt: skip
    done = subprocess.run(
        [chromium, *flags, page.as_uri()], capture_output=True, text=True, timeout=120, check=True
    )
    return Dom(done.stdout)


def test_the_html_page_opened_in_a_headless_browser_shows_the_reports_numbers(tmp_path):
    report = report_of(fleet_recording())
    page = tmp_path / "report.html"
    page.write_text(render_html(report))
    dom = browser_dom(page)

    (table,) = dom.find("table", id="rows")
    assert [th["text"] for th in dom.find("th", table)] == [c.label for c in COLUMNS]
    rows = dom.find("tr", class_="report-row")
    assert len(rows) == len(report.rows) == 3
    for tr, row in zip(rows, report.rows, strict=True):
        key = (
            tr["attrs"]["data-namespace"],
            tr["attrs"]["data-service"],
            tr["attrs"]["data-model"],
        )
        assert key == (row.namespace, row.service, row.model)
        cells = dom.find("td", tr)
        assert [td["attrs"]["class"].split()[0] for td in cells] == [c.css_class for c in COLUMNS]
        for column, cell in zip(COLUMNS, cells, strict=True):
            assert cell["text"] == column.shown(row), column.key
    for column in (*COLUMNS, *SAVINGS):
        if column.digits is not None and column.value(report.total) is not None:
            (figure,) = dom.find("dd", id=f"total-{column.css_class}") or dom.find(
                "td", dom.find("tr", class_="total-row")[0], class_=column.css_class
            )
            assert float(figure["text"]) == pytest.approx(
                column.value(report.total), abs=10**-column.digits
            )
    assert dom.find("dd", id="total-held-gpu-hours")[0]["text"] == "2.125"
    assert dom.find("dd", id="total-whole-gpu-hours")[0]["text"] == "6.000"

    bars = {(b["attrs"]["data-label"], b["attrs"]["data-series"]): float(b["attrs"]["data-value"])
            for b in dom.find("rect", class_="bar")}  # fmt: skip
    assert bars[("team/chat", "before: whole GPUs")] == pytest.approx(4.0)
    assert bars[("team/chat", "after: shared")] == pytest.approx(1.0)
    assert bars[("lab/-", "before: whole GPUs")] == pytest.approx(1.0)
    for plot in ("plot-gpus-over-time", "plot-utilization-over-time"):
        (svg,) = dom.find("svg", id=plot)
        assert dom.find("polyline", svg), plot
    # Self-contained: nothing is fetched from anywhere.
    assert not [n for n in dom.all() if n["tag"] in ("script", "link", "img", "iframe")]
    assert "http" not in page.read_text().replace("http://www.w3.org/2000/svg", "")


def test_the_page_escapes_what_the_labels_carry():
    hostile = held("<b>pod</b>", "GPU-a", 1.0, namespace='"><script>x</script>')
    page = render_html(report_of(recording(hostile)))
    assert "<script>" not in page and "<b>" not in page


def test_the_built_in_report_helpers_read_a_recorded_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(fleet_recording()))
    assert to_json(report_from_recording(path)) == to_json(report_of(fleet_recording()))
