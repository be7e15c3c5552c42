"""The DRA driver's settings: one versioned YAML file, overridden by flags.

Every field is checked when the config loads, so a typo or an impossible value stops the
driver at start with the field named, never when a claim is prepared.

    version: v1
    nodeName: ""            # or env NODE_NAME
    fakeFleet: ""           # a fleet file -> FakeNvml for nodeName; "" -> real NVML
    pluginDir: /var/lib/kubelet/plugins/gpu.infergrid.io
    registryDir: /var/lib/kubelet/plugins_registry
    cdiDir: /var/run/cdi
    mps: false
    mpsRoot: /run/infergrid/mps
    metricsPort: 0          # /metrics, /healthz and /readyz on this port, 0 = off
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dra_driver.kubelet.pluginregistration.v1 import REGISTRY_DIR
from infergrid import dra, settings
from infergrid.errors import ContractError
from infergrid.settings import Setting, boolean, load_settings, parse_settings, path, text, whole

PLUGIN_DIR: Final = f"/var/lib/kubelet/plugins/{dra.DRIVER}"
CDI_DIR: Final = "/var/run/cdi"
MPS_ROOT: Final = "/run/infergrid/mps"
"""The device plugin's MPS root: the MPS daemons are the same whichever mode the node is in."""
MAX_SOCKET_CHARS: Final = 107
"""A unix socket's path holds at most 107 bytes; a longer one cannot be bound."""


def _absolute(doc: dict[str, Any], key: str) -> Path:
    folder = path(doc, key)
    if not folder.is_absolute():
        raise ContractError(key, f"must be an absolute path, got {str(folder)!r}")
    return folder


def _socket_folder(socket: str):
    """An absolute folder in which ``socket`` still fits a unix socket's path."""

    def read(doc: dict[str, Any], key: str) -> Path:
        folder = _absolute(doc, key)
        if len(str(folder / socket)) > MAX_SOCKET_CHARS:
            raise ContractError(key, f"is too long for the socket {socket} in it")
        return folder

    return read


def _fleet(doc: dict[str, Any], key: str) -> Path | None:
    """A fleet file, or "" for real NVML."""
    return None if doc.get(key) == "" else path(doc, key)


@dataclass(frozen=True, slots=True)
class DriverConfig:
    node_name: str = ""
    fake_fleet: Path | None = None
    plugin_dir: Path = Path(PLUGIN_DIR)
    registry_dir: Path = Path(REGISTRY_DIR)
    cdi_dir: Path = Path(CDI_DIR)
    mps: bool = False
    mps_root: Path = Path(MPS_ROOT)
    metrics_port: int = 0

    @property
    def mps_root_or_none(self) -> Path | None:
        """Where share holders find the MPS daemons; None on a node without MPS."""
        return self.mps_root if self.mps else None


SETTINGS: Final = (
    Setting("nodeName", "node_name", text, "this node's name (or env NODE_NAME)", cli="--node"),
    Setting("fakeFleet", "fake_fleet", _fleet, "fleet file: run on fake NVML; empty: real NVML"),
    Setting("pluginDir", "plugin_dir", _socket_folder("dra.sock"),
            "the driver's folder: its DRA socket dra.sock and its checkpoint"),
    Setting("registryDir", "registry_dir", _socket_folder(f"{dra.DRIVER}-reg.sock"),
            "the kubelet's plugin registry folder"),
    Setting("cdiDir", "cdi_dir", _absolute, "where CDI specs of prepared claims are written"),
    Setting("mps", "mps", boolean, "shares get the MPS daemon and limits (device plugin's)",
            boolean=True),
    Setting("mpsRoot", "mps_root", _absolute, "host folder of the MPS daemons' pipes"),
    Setting("metricsPort", "metrics_port", whole(0, 65535), "/metrics, /healthz, /readyz; 0: off"),
)  # fmt: skip


def parse_config(doc: object) -> dict:
    """The fields a config document sets, checked; absent ones keep their defaults."""
    return parse_settings(doc, SETTINGS)


def add_flags(parser: argparse.ArgumentParser) -> None:
    settings.add_flags(parser, SETTINGS)


def load_config(args: argparse.Namespace, env_node: str | None = None) -> DriverConfig:
    """Defaults, then env NODE_NAME, then the file, then flags, each checked by one reader."""
    config = load_settings(DriverConfig(), SETTINGS, args, node_name=env_node)
    if not config.node_name:
        raise ContractError("nodeName", "is required (flag --node or env NODE_NAME)")
    return config
