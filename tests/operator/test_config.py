"""The operator's settings: defaults, the file, flags, and bad values named."""

from __future__ import annotations

import argparse

import pytest

from inference_operator.autoscaler import ScalingPolicy
from inference_operator.config import SETTINGS, OperatorConfig, scans_namespaces
from inference_operator.spec import Autoscaling
from infergrid.errors import ContractError
from infergrid.settings import add_flags, load_settings


def load(argv: list[str]) -> OperatorConfig:
    parser = argparse.ArgumentParser()
    add_flags(parser, SETTINGS)
    return load_settings(OperatorConfig(), SETTINGS, parser.parse_args(argv))


def test_defaults():
    cfg = load([])
    assert cfg.scheduler_name == "infergrid-scheduler"
    assert cfg.engine_image == "infergrid/engine:0.1.0"
    assert cfg.namespaces == ()
    assert cfg.metrics_url_template == "http://{pod_ip}:{port}/metrics"
    assert cfg.hf_cache_claim == "" and cfg.allow_model_download is False


def test_model_storage_settings_from_the_file_and_flags(tmp_path):
    path = tmp_path / "operator.yaml"
    path.write_text("version: v1\nhfCacheClaim: hf-cache\nallowModelDownload: true\n")
    cfg = load(["--config", str(path)])
    assert (cfg.hf_cache_claim, cfg.allow_model_download) == ("hf-cache", True)
    cfg = load(["--config", str(path), "--hf-cache-claim", "", "--no-allow-model-download"])
    assert (cfg.hf_cache_claim, cfg.allow_model_download) == ("", False)
    cfg = load(["--hf-cache-claim", "models.team-a", "--allow-model-download"])
    assert (cfg.hf_cache_claim, cfg.allow_model_download) == ("models.team-a", True)


@pytest.mark.parametrize("claim", ["HF", "hf/cache", "hf-cache/", "-hf", "a" * 254, "pvc://x"])
def test_a_cache_claim_that_is_no_claim_name_is_named(claim):
    with pytest.raises(ContractError) as err:
        load([f"--hf-cache-claim={claim}"])
    assert err.value.field == "hfCacheClaim"


def test_allow_model_download_in_the_file_is_a_boolean(tmp_path):
    path = tmp_path / "operator.yaml"
    path.write_text("version: v1\nallowModelDownload: 'yes'\n")
    with pytest.raises(ContractError) as err:
        load(["--config", str(path)])
    assert err.value.field == "allowModelDownload"


def test_file_then_flags(tmp_path):
    path = tmp_path / "operator.yaml"
    path.write_text("version: v1\nnamespaces: [a, b]\nscrapeTimeoutSeconds: 5\n")
    cfg = load(["--config", str(path), "--namespaces", "c, d",
                "--metrics-url-template", "http://127.0.0.1:9/{pod_name}"])  # fmt: skip
    assert cfg.namespaces == ("c", "d")
    assert cfg.scrape_timeout_s == 5
    assert cfg.metrics_url_template == "http://127.0.0.1:9/{pod_name}"


@pytest.mark.parametrize(
    "argv",
    [["--metrics-url-template", "http://{host}/metrics"], ["--scrape-timeout", "0"]],
)
def test_bad_values_are_named(argv):
    with pytest.raises(ContractError):
        load(argv)


GATEWAY = "http://infergrid-gateway-metrics.infergrid.svc:9090/metrics"


def test_the_gateways_metrics_url_is_none_by_default_and_set_by_file_or_flag(tmp_path):
    assert load([]).gateway_metrics_url == ""
    path = tmp_path / "operator.yaml"
    path.write_text(f"version: v1\ngatewayMetricsUrl: {GATEWAY}\n")
    assert load(["--config", str(path)]).gateway_metrics_url == GATEWAY
    assert load(["--config", str(path), "--gateway-metrics-url", ""]).gateway_metrics_url == ""
    assert load([f"--gateway-metrics-url={GATEWAY}"]).gateway_metrics_url == GATEWAY


@pytest.mark.parametrize(
    "url", ["infergrid-gateway:9090/metrics", "ftp://gw/metrics", "http://", "http://gw:port/"]
)
def test_a_gateway_metrics_url_that_is_no_http_url_is_named(url):
    with pytest.raises(ContractError) as err:
        load([f"--gateway-metrics-url={url}"])
    assert err.value.field == "gatewayMetricsUrl"


def test_policy_reads_percentages_as_fractions():
    policy = ScalingPolicy.from_spec(Autoscaling(tolerance_percent=15, warm_pool=2))
    assert policy.tolerance == 0.15 and policy.warm_pool == 2
    assert (policy.min_replicas, policy.max_replicas, policy.stabilization_s) == (1, 4, 300)


def test_named_namespaces_are_served_without_scanning_and_patterns_are_scanned():
    assert not scans_namespaces(())
    assert not scans_namespaces(("team-a", "team-b"))
    assert scans_namespaces(("team-*",))
    assert scans_namespaces(("team-a", "!team-b"))


def test_runtime_images_come_from_the_file_or_a_json_flag(tmp_path):
    assert load([]).runtime_images == ()
    path = tmp_path / "operator.yaml"
    path.write_text('version: v1\nruntimeImages: {"llama.cpp": "infergrid/llama-cpp:1"}\n')
    assert load(["--config", str(path)]).runtime_images == (("llama.cpp", "infergrid/llama-cpp:1"),)
    flag = '{"vllm": "v:1", "sglang": "s:1"}'
    assert load([f"--runtime-images={flag}"]).runtime_images == (("sglang", "s:1"), ("vllm", "v:1"))


@pytest.mark.parametrize(
    ("flag", "field"),
    [
        ('{"infergrid": "e:1"}', "runtimeImages.infergrid"),  # that one is engineImage
        ('{"custom": "c:1"}', "runtimeImages.custom"),
        ('{"vllm": ""}', "runtimeImages.vllm"),
        ('{"vllm": 1}', "runtimeImages.vllm"),
        ('["vllm"]', "runtimeImages"),
        ("{vllm", "runtimeImages"),
    ],
)
def test_a_runtime_image_that_is_not_one_is_named(flag, field):
    with pytest.raises(ContractError) as err:
        load([f"--runtime-images={flag}"])
    assert err.value.field == field
