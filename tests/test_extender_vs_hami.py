"""The HAMi comparison's pure parts: HAMi sees the fleet's GPUs, both get the same shares."""

import json
import subprocess
import threading

import pytest
import yaml

from bench.extender_vs_hami import (
    HAMI_SCHEDULER,
    hami_device_config,
    hami_gpus_seen,
    hami_register_annotation,
    hami_scheduler_config,
    share_limits,
    share_stream,
    table,
)
from bench.hami_build import PINNED_COMMIT, HamiSourceError, commit_of, ensure_built
from infergrid import constants
from infergrid.fleet import parse_fleet


def fleet_node(**gpus):
    spec = {"model": "NVIDIA L4", "count": 4, "memoryMiB": 23034, "smCount": 58,
            "computeCapability": "8.9", **gpus}  # fmt: skip
    entry = {"name": "n", "gpus": spec, "topology": {"numaNodes": 2}}
    return parse_fleet({"version": "v1", "nodes": [entry]}, "test").nodes[0]


def test_hamis_register_annotation_lists_each_fleet_gpu_as_its_device_plugin_would():
    node = fleet_node()
    devices = json.loads(hami_register_annotation(node.inventory))
    assert [d["id"] for d in devices] == [g.uuid for g in node.inventory.gpus]
    assert [d["index"] for d in devices] == [0, 1, 2, 3]
    assert [d["numa"] for d in devices] == [0, 0, 1, 1]
    first = devices[0]
    assert first["devmem"] == 23034 and first["devcore"] == 100
    assert first["type"] == "NVIDIA L4" and first["mode"] == "hami-core"
    assert first["health"] is True
    assert first["count"] == node.inventory.share_slots


def test_a_model_name_without_the_vendor_gets_the_prefix_hamis_plugin_adds():
    devices = json.loads(hami_register_annotation(fleet_node(model="Tesla T4").inventory))
    assert devices[0]["type"] == "NVIDIA-Tesla T4"


def test_both_systems_get_the_same_share_in_their_own_resource_names():
    assert share_limits("InferGrid", 8192, 30) == {
        constants.RESOURCE_VGPU: "1", constants.RESOURCE_GPU_MEMORY: "8192",
        constants.RESOURCE_GPU_CORES: "30"}  # fmt: skip
    assert share_limits("HAMi", 8192, 30) == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "8192",
        "nvidia.com/gpucores": "30",
    }
    assert share_limits("HAMi", 4096, None) == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}


def test_an_unknown_system_is_named_in_the_error():
    with pytest.raises(ValueError, match="system: 'volcano'"):
        share_limits("volcano", 4096, None)


def test_the_stream_is_the_same_for_the_same_seed_and_mixes_sizes():
    assert share_stream(50, 7) == share_stream(50, 7)
    assert len({mib for mib, _ in share_stream(50, 7)}) > 1
    assert share_stream(50, 7) != share_stream(50, 8)


def test_hamis_kube_scheduler_calls_its_extender_for_filter_and_bind_only():
    config = yaml.safe_load(hami_scheduler_config("/kc", "http://127.0.0.1:9"))
    assert config["profiles"] == [{"schedulerName": HAMI_SCHEDULER}]
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "http://127.0.0.1:9"
    assert extender["filterVerb"] == "filter" and extender["bindVerb"] == "bind"
    assert "prioritizeVerb" not in extender
    managed = {r["name"]: r["ignoredByScheduler"] for r in extender["managedResources"]}
    assert managed["nvidia.com/gpu"] is True and managed["nvidia.com/gpumem"] is True


def test_hamis_device_config_splits_each_gpu_as_the_annotation_says():
    nvidia = yaml.safe_load(hami_device_config(6))["nvidia"]
    assert nvidia["deviceSplitCount"] == 6
    assert nvidia["resourceMemoryName"] == "nvidia.com/gpumem"


def phase(filter_p99: float, pods_per_s: float) -> dict:
    latency = {"n": 1, "p50_ms": 1.0, "p99_ms": filter_p99}
    return {"filter": latency, "bind": latency, "failed_binds": 0, "pods_per_s": pods_per_s,
            "extender_ms_per_pod": 3.0}  # fmt: skip


def test_the_table_puts_hami_over_infergrid_and_never_divides_by_zero():
    rows = {"InferGrid": {"stream": phase(2.0, 0), "burst": phase(4.0, 50.0)},
            "HAMi": {"stream": phase(6.0, 0), "burst": phase(2.0, 5.0)}}  # fmt: skip
    lines = table(rows).splitlines()
    assert "| stream filter p99 (ms) | 2 | 6 | 3.00 |" in lines
    assert "| burst pods/s | 50 | 5 | 0.10 |" in lines
    assert "| burst failed binds | 0 | 0 | - |" in lines


def test_hamis_metrics_say_which_gpus_it_offers():
    metrics = "\n".join([
        "# HELP hami_gpu_memory_limit_bytes Device memory limit for a certain GPU",
        'hami_gpu_memory_limit_bytes{device_index="0",device_type="NVIDIA L4",'
        'device_uuid="GPU-a",node="gpu-0"} 2.4e+10',
        'hami_gpu_core_limit_ratio{device_index="0",device_type="NVIDIA L4",'
        'device_uuid="GPU-b",node="gpu-0"} 100',
        'hami_gpu_memory_limit_bytes{device_index="1",device_type="NVIDIA L4",'
        'device_uuid="GPU-c",node="gpu-0"} 2.4e+10',
    ])  # fmt: skip
    assert hami_gpus_seen(metrics) == {"GPU-a", "GPU-c"}


def test_the_relay_forwards_each_verb_as_sent_and_counts_a_bind_error_as_failed():
    import socket
    import urllib.request

    from bench.extender_vs_hami import TimingRelay

    answers = {"/filter": b'{"NodeNames": ["n"]}', "/bind": b'{"Error": "node n is locked"}'}

    class Upstream(threading.Thread):  # the extender: answers by path, as it was asked
        def run(self):
            from http.server import BaseHTTPRequestHandler, HTTPServer

            class Handler(BaseHTTPRequestHandler):
                protocol_version = "HTTP/1.1"  # keep-alive, as Go's and aiohttp's servers

                def do_POST(self):
                    self.rfile.read(int(self.headers["Content-Length"]))
                    body = answers[self.path]
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

                def log_message(self, *args):
                    pass

            self.server = HTTPServer(("127.0.0.1", 0), Handler)
            self.port = self.server.server_address[1]
            self.ready.set()
            self.server.serve_forever()

    upstream = Upstream(daemon=True)
    upstream.ready = threading.Event()
    upstream.start()
    assert upstream.ready.wait(10)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        listen = s.getsockname()[1]
    relay = TimingRelay(listen, upstream.port)
    relay.start()
    try:
        for path in ("/filter", "/bind"):
            req = urllib.request.Request(f"http://127.0.0.1:{listen}{path}", data=b"{}")
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.read() == answers[path]
    finally:
        relay.stop()
        upstream.server.shutdown()
    assert [(path, ok) for path, _, ok in relay.take()] == [("/filter", True), ("/bind", False)]
    assert relay.take() == []


def test_a_checkout_at_another_commit_than_the_pinned_one_is_refused_naming_both(tmp_path):
    """The table of docs/placement.md names the commit it measured; the bench will not build another
    unless asked to by name."""
    src = tmp_path / "hami"
    (src / "cmd" / "scheduler").mkdir(parents=True)
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    at = commit_of(src)
    with pytest.raises(HamiSourceError, match=f"at {at[:12]}, not {PINNED_COMMIT[:12]}"):
        ensure_built(src)
    with pytest.raises(HamiSourceError, match="no cmd/scheduler"):
        ensure_built(tmp_path)
