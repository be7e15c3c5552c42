"""`infergrid-device-plugin`: advertise this node's GPUs to the kubelet.

infergrid-device-plugin --node NODE                       # real GPUs through NVML
infergrid-device-plugin --fake-fleet FLEET --node NODE    # a fleet file's node, no GPU
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from kubernetes import client, config

from device_plugin.config import PluginConfig, add_flags, load_config
from device_plugin.kube import KubePods, patch_node, set_node_condition
from device_plugin.pod_resources import PodResourcesClient
from device_plugin.runtime import DevicePluginRuntime
from infergrid.errors import ContractError
from infergrid.nvml.backend import NvmlBackend, NvmlError
from infergrid.nvml.opened import open_backend
from infergrid.ops_server import serve_ops
from infergrid.process import configure_logging, kube_api

log = logging.getLogger("infergrid.device_plugin")


def make_backend(cfg: PluginConfig) -> NvmlBackend:
    return open_backend(cfg.fake_fleet, cfg.node_name)


def _fake_work(backend: NvmlBackend) -> Callable[[dict[str, float]], None] | None:
    """On fake NVML, the pods holding each GPU run on it (the fleet's heldBusyPercent)."""
    from infergrid.nvml.fake import FakeNvml

    return backend.run if isinstance(backend, FakeNvml) else None


def build(cfg: PluginConfig) -> DevicePluginRuntime:
    backend = make_backend(cfg)
    core = client.CoreV1Api(kube_api())
    pods = KubePods(core, cfg.node_name)
    patch = (lambda a, lab: patch_node(core, cfg.node_name, a, lab)) if cfg.publish else None
    held = PodResourcesClient(cfg.pod_resources_socket) if cfg.pod_resources_socket else None
    return DevicePluginRuntime(
        cfg,
        backend,
        pods,
        patch,
        on_grants=pods.mark_allocated,
        held=held,
        pod_conditions=pods if cfg.publish else None,
        on_holders=_fake_work(backend),
        node_condition=(
            (lambda c: set_node_condition(core, cfg.node_name, c, datetime.now(UTC)))
            if cfg.publish
            else None
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="infergrid-device-plugin", description=__doc__)
    add_flags(parser)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        cfg = load_config(args, os.environ.get("NODE_NAME"))
        cfg.plugin_dir.mkdir(parents=True, exist_ok=True)
        runtime = build(cfg)
    except (ContractError, NvmlError, OSError, config.ConfigException) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    ops = (
        serve_ops(cfg.metrics_port, runtime.plugins.registered.is_set) if cfg.metrics_port else None
    )
    runtime.start()
    log.info("device plugin for node %s serving in %s", cfg.node_name, cfg.plugin_dir)
    stopped.wait()
    runtime.stop()
    if ops:
        ops.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
