"""The device plugin's settings: one versioned YAML file, overridden by flags.

Every field is checked when the config loads, so a typo or an impossible
value stops the plugin at start with the field named, never at Allocate time.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Final

from device_plugin.kubelet import DEVICE_PLUGIN_DIR
from infergrid.codec import check_version, expect, field, integer, reject_unknown
from infergrid.constants import DEFAULT_VGPU_SLOTS_PER_GPU
from infergrid.errors import ContractError
from infergrid.yamlfile import read_yaml

MIG_STRATEGIES: Final = ("none", "single", "mixed")


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """What the plugin advertises and how it runs; defaults suit a GPU node."""

    node_name: str = ""
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


_YAML_KEYS: Final = {
    "nodeName": "node_name",
    "pluginDir": "plugin_dir",
    "fakeFleet": "fake_fleet",
    "gpuReplicas": "gpu_replicas",
    "vgpuSlotsPerGpu": "vgpu_slots_per_gpu",
    "migStrategy": "mig_strategy",
    "mps": "mps",
    "cdi": "cdi",
    "healthQuietPeriodSeconds": "health_quiet_period_s",
    "usageIntervalSeconds": "usage_interval_s",
    "metricsPort": "metrics_port",
    "publish": "publish",
}


def _number(doc: dict[str, Any], key: str, low: float, high: float) -> float:
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ContractError(key, f"expected a number, got {type(value).__name__}")
    if not low <= value <= high:
        raise ContractError(key, f"must be from {low:g} to {high:g}, got {value}")
    return float(value)


def parse_config(doc: object) -> dict[str, Any]:
    """The fields a config document sets, checked; absent ones keep their defaults."""
    doc = expect(doc, dict, "config")
    check_version(doc)
    reject_unknown(doc, ["version", *_YAML_KEYS])
    readers = {
        "nodeName": lambda k: field(doc, k, str),
        "pluginDir": lambda k: Path(field(doc, k, str)),
        "fakeFleet": lambda k: Path(field(doc, k, str)),
        "gpuReplicas": lambda k: integer(doc, k, low=1, high=64),
        "vgpuSlotsPerGpu": lambda k: integer(doc, k, low=1, high=128),
        "migStrategy": lambda k: _choice(field(doc, k, str), k),
        "mps": lambda k: field(doc, k, bool),
        "cdi": lambda k: field(doc, k, bool),
        "healthQuietPeriodSeconds": lambda k: _number(doc, k, 0, 86400),
        "usageIntervalSeconds": lambda k: _number(doc, k, 0.1, 10),
        "metricsPort": lambda k: integer(doc, k, low=0, high=65535),
        "publish": lambda k: field(doc, k, bool),
    }
    return {_YAML_KEYS[k]: readers[k](k) for k in doc if k != "version"}


def _choice(value: str, key: str) -> str:
    if value not in MIG_STRATEGIES:
        raise ContractError(key, f"{value!r} is not one of {', '.join(MIG_STRATEGIES)}")
    return value


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Flags for every setting; a flag left out keeps the file's value."""
    parser.add_argument("--config", type=Path, help="YAML config file (version: v1)")
    parser.add_argument("--node", dest="node_name", help="this node's name (or NODE_NAME)")
    parser.add_argument("--plugin-dir", type=Path, help="the kubelet's device-plugin folder")
    parser.add_argument("--fake-fleet", type=Path, help="fleet file: run on fake NVML")
    parser.add_argument("--gpu-replicas", type=int, help="time-sliced replicas per GPU")
    parser.add_argument("--vgpu-slots-per-gpu", type=int, help="share slots per GPU")
    parser.add_argument("--mig-strategy", choices=MIG_STRATEGIES)
    parser.add_argument("--mps", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--cdi", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--health-quiet-period", dest="health_quiet_period_s", type=float)
    parser.add_argument("--usage-interval", dest="usage_interval_s", type=float)
    parser.add_argument("--metrics-port", type=int, help="0 turns /metrics off")
    parser.add_argument("--publish", action=argparse.BooleanOptionalAction, default=None)


def load_config(args: argparse.Namespace, env_node: str | None = None) -> PluginConfig:
    """File, then flags; the result is validated as a whole, as a file would be."""
    settings: dict[str, Any] = {}
    if env_node:
        settings["node_name"] = env_node
    if args.config:
        settings.update(parse_config(read_yaml(args.config)))
    names = {f.name for f in fields(PluginConfig)}
    settings.update({k: v for k, v in vars(args).items() if k in names and v is not None})
    config = replace(PluginConfig(), **settings)
    return _validated(config)


def _validated(config: PluginConfig) -> PluginConfig:
    """Re-checks flag values with the file's rules, so both fail the same way."""
    doc = {"version": "v1"}
    for key, attr in _YAML_KEYS.items():
        value = getattr(config, attr)
        if value is not None and key not in ("pluginDir", "fakeFleet"):
            doc[key] = value
    if not config.node_name:
        raise ContractError("nodeName", "is required (flag --node or env NODE_NAME)")
    parse_config(doc)
    return config
