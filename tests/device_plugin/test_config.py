"""A malformed config stops the plugin at start with the field named."""

from __future__ import annotations

import argparse

import pytest

from device_plugin.config import PluginConfig, add_flags, load_config, parse_config
from device_plugin.main import main
from infergrid.errors import ContractError


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return parser.parse_args(list(argv))


def test_file_then_flags_then_validation(tmp_path):
    cfg = tmp_path / "plugin.yaml"
    cfg.write_text("version: v1\nnodeName: from-file\ngpuReplicas: 2\nmigStrategy: single\n")
    config = load_config(args("--config", str(cfg), "--gpu-replicas", "3"))
    assert (config.node_name, config.gpu_replicas, config.mig_strategy) == (
        "from-file",
        3,
        "single",
    )
    assert load_config(args("--node", "n1"), env_node="env").node_name == "n1"
    assert load_config(args(), env_node="env").node_name == "env"


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"version": "v2"}, "version"),
        ({"version": "v1", "gpuReplica": 2}, "gpuReplica"),
        ({"version": "v1", "gpuReplicas": 0}, "gpuReplicas"),
        ({"version": "v1", "gpuReplicas": "2"}, "gpuReplicas"),
        ({"version": "v1", "vgpuSlotsPerGpu": 1000}, "vgpuSlotsPerGpu"),
        ({"version": "v1", "migStrategy": "all"}, "migStrategy"),
        ({"version": "v1", "mps": "yes"}, "mps"),
        ({"version": "v1", "usageIntervalSeconds": 30}, "usageIntervalSeconds"),
        ({"version": "v1", "healthQuietPeriodSeconds": True}, "healthQuietPeriodSeconds"),
        ({"version": "v1", "metricsPort": 70000}, "metricsPort"),
        ({"version": "v1", "deviceListStrategy": "volume-mount"}, "deviceListStrategy"),
        ({"version": "v1", "deviceListStrategy": True}, "deviceListStrategy"),
        ({"version": "v1", "cdi": True}, "cdi"),
        ({"version": "v1", "podResourcesSocket": 5}, "podResourcesSocket"),
        ("just text", "config"),
    ],
)
def test_bad_config_names_the_field(doc, field):
    with pytest.raises(ContractError) as bad:
        parse_config(doc)
    assert bad.value.field == field


def test_flags_are_checked_like_the_file():
    with pytest.raises(ContractError) as bad:
        load_config(args("--node", "n", "--vgpu-slots-per-gpu", "0"))
    assert bad.value.field == "vgpuSlotsPerGpu"
    with pytest.raises(ContractError) as missing:
        load_config(args())
    assert missing.value.field == "nodeName"


def test_defaults_suit_a_gpu_node():
    config = PluginConfig(node_name="n")
    assert (config.gpu_replicas, config.vgpu_slots_per_gpu, config.mig_strategy) == (1, 10, "mixed")
    assert config.usage_interval_s <= 10
    assert config.device_list_strategy == "volume-mounts"
    assert config.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"


def test_an_unknown_device_list_strategy_is_refused_with_the_choices():
    with pytest.raises(ContractError) as bad:
        load_config(args("--node", "n", "--device-list-strategy", "env"))
    assert bad.value.field == "deviceListStrategy"
    assert "'env' is not one of volume-mounts, cdi, envvar" in str(bad.value)


def test_an_empty_pod_resources_socket_turns_it_off(tmp_path):
    cfg = tmp_path / "plugin.yaml"
    cfg.write_text('version: v1\nnodeName: n\npodResourcesSocket: ""\ndeviceListStrategy: cdi\n')
    config = load_config(args("--config", str(cfg)))
    assert (config.pod_resources_socket, config.device_list_strategy) == ("", "cdi")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--node", "x", "--fake-fleet", "missing.yaml"], "missing.yaml: cannot read"),
        (["--node", "nowhere", "--fake-fleet", "e2e/fleets/sample.yaml"], "nodeName: 'nowhere'"),
        (["--fake-fleet", "e2e/fleets/sample.yaml"], "nodeName: is required"),
    ],
)
def test_the_cli_reports_bad_input_and_exits_2(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main([*argv, "--plugin-dir", "/tmp/infergrid-cli-test", "--metrics-port", "0"]) == 2
    assert message in capsys.readouterr().err
