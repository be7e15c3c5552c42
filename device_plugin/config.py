"""The device plugin's settings: one versioned YAML file, overridden by flags.

Every field is checked when the config loads, so a typo or an impossible
value stops the plugin at start with the field named, never at Allocate time.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from device_plugin.kubelet import DEVICE_PLUGIN_DIR
from infergrid import settings as s
from infergrid.constants import DEFAULT_VGPU_SLOTS_PER_GPU, SCHEDULER_NAME
from infergrid.errors import ContractError

MIG_STRATEGIES: Final = ("none", "single", "mixed")


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """What the plugin advertises and how it runs; defaults suit a GPU node."""

    node_name: str = ""
    # Only pods this scheduler bound (the one that calls the extender) get a GPU.
    scheduler_name: str = SCHEDULER_NAME
    plugin_dir: Path = Path(DEVICE_PLUGIN_DIR)
    fake_fleet: Path | None = None
    gpu_replicas: int = 1
    vgpu_slots_per_gpu: int = DEFAULT_VGPU_SLOTS_PER_GPU
    mig_strategy: str = "mixed"
    mps: bool = False
    cdi: bool = False
    health_quiet_period_s: float = 60.0
    usage_interval_s: float = 5.0
    metrics_port: int = 9400
    publish: bool = True


SETTINGS: Final = (
    s.Setting("nodeName", "node_name", s.text, "this node's name (or env NODE_NAME)", cli="--node"),
    s.Setting("schedulerName", "scheduler_name", s.text,
              "only pods this scheduler bound get GPUs (the extender's)"),
    s.Setting("pluginDir", "plugin_dir", s.path, "the kubelet's device-plugin folder"),
    s.Setting("fakeFleet", "fake_fleet", s.path, "fleet file: run on fake NVML"),
    s.Setting("gpuReplicas", "gpu_replicas", s.whole(1, 64), "time-sliced replicas per GPU"),
    s.Setting("vgpuSlotsPerGpu", "vgpu_slots_per_gpu", s.whole(1, 128), "share slots per GPU"),
    s.Setting("migStrategy", "mig_strategy", s.choice(MIG_STRATEGIES), "none, single or mixed"),
    s.Setting("mps", "mps", s.boolean, "return MPS limits for shares", boolean=True),
    s.Setting("cdi", "cdi", s.boolean, "also return CDI device names", boolean=True),
    s.Setting("healthQuietPeriodSeconds", "health_quiet_period_s", s.number(0, 86400),
              "a GPU recovers after this long without a fault"),
    s.Setting("usageIntervalSeconds", "usage_interval_s", s.number(0.1, 10),
              "seconds between usage heartbeats"),
    s.Setting("metricsPort", "metrics_port", s.whole(0, 65535), "0 turns /metrics off"),
    s.Setting("publish", "publish", s.boolean, "write node annotations", boolean=True),
)  # fmt: skip


def parse_config(doc: object) -> dict:
    """The fields a config document sets, checked; absent ones keep their defaults."""
    return s.parse_settings(doc, SETTINGS)


def add_flags(parser: argparse.ArgumentParser) -> None:
    s.add_flags(parser, SETTINGS)


def load_config(args: argparse.Namespace, env_node: str | None = None) -> PluginConfig:
    """File, then flags, each checked by the same reader."""
    config = s.load_settings(PluginConfig(), SETTINGS, args, node_name=env_node)
    if not config.node_name:
        raise ContractError("nodeName", "is required (flag --node or env NODE_NAME)")
    return config
