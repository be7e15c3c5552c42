"""`python -m dra_driver`: the kubelet DRA plugin of this node's GPUs.

python -m dra_driver --config FILE [--log-level LEVEL] [--kubeconfig FILE]

Every config field also has a flag (--node, --fake-fleet, --plugin-dir, ...) that overrides
the file. On SIGTERM it stops serving and removes its sockets; its ResourceSlices stay, and
the kubelet wipes them if the driver does not come back.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from kubernetes import client, config

from dra_driver.checkpoint import Checkpoint
from dra_driver.claims import ApiError, ClaimPreparer
from dra_driver.config import DriverConfig, add_flags, load_config
from dra_driver.gpus import NodeGpus
from dra_driver.kube import KubeApi
from dra_driver.plugin import KubeletPlugin
from dra_driver.publisher import SlicePublisher
from infergrid.constants import ANNOTATION_GPU_INVENTORY
from infergrid.errors import ContractError
from infergrid.nvml.backend import NvmlBackend, NvmlError
from infergrid.nvml.opened import open_backend
from infergrid.ops_server import serve_ops
from infergrid.process import configure_logging, kube_api

log = logging.getLogger("infergrid.dra_driver")


def make_backend(cfg: DriverConfig) -> NvmlBackend:
    return open_backend(cfg.fake_fleet, cfg.node_name)


def node_owner(node: dict) -> dict:
    """The ownerReference that ties a slice to its Node: deleting the node deletes them.

    Raises ContractError on a node in device-plugin mode: a node is in one mode, and two
    bookkeepers of one GPU would hand it out twice.
    """
    metadata = node["metadata"]
    if ANNOTATION_GPU_INVENTORY in (metadata.get("annotations") or {}):
        raise ContractError(
            "nodeName",
            f"node {metadata['name']} carries {ANNOTATION_GPU_INVENTORY}: it is in device-plugin "
            "mode; stop the device plugin and remove the annotation before running DRA here",
        )
    return {"apiVersion": "v1", "kind": "Node", "name": metadata["name"], "uid": metadata["uid"]}


def api_client(kubeconfig: Path | None) -> client.ApiClient:
    if kubeconfig is None:
        return kube_api()
    return config.new_client_from_config(config_file=str(kubeconfig))


class Driver:
    """The parts, wired: GPUs read by the publisher and mapped by prepare, one kube edge."""

    def __init__(self, cfg: DriverConfig, backend: NvmlBackend, api: KubeApi, owner: dict):
        self.backend = backend
        self.gpus = NodeGpus(backend)
        self.gpus.read()
        preparer = ClaimPreparer(
            cfg.node_name,
            api.read_claim,
            self.gpus.devices,
            cfg.cdi_dir,
            Checkpoint(cfg.plugin_dir),
            cfg.mps_root_or_none,
        )
        self.plugin = KubeletPlugin(preparer, cfg.plugin_dir, cfg.registry_dir)
        self.publisher = SlicePublisher(api, cfg.node_name, owner)
        self.stopped = threading.Event()
        self._thread = threading.Thread(
            target=self.publisher.run, args=(self.gpus.read, self.stopped), name="slices"
        )

    def start(self) -> None:
        self.plugin.start()
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.plugin.stop()
        self._thread.join(timeout=15)
        self.backend.close()


def build(args: argparse.Namespace) -> tuple[DriverConfig, Driver]:
    cfg = load_config(args, os.environ.get("NODE_NAME"))
    cfg.plugin_dir.mkdir(parents=True, exist_ok=True)
    api = KubeApi(api_client(args.kubeconfig))
    owner = node_owner(api.read_node(cfg.node_name))
    return cfg, Driver(cfg, make_backend(cfg), api, owner)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra_driver", description=__doc__)
    add_flags(parser)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--kubeconfig", type=Path, help="default: in-cluster, else KUBECONFIG")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        cfg, driver = build(args)
    except (ContractError, ApiError, NvmlError, OSError, config.ConfigException) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    ops = serve_ops(cfg.metrics_port, lambda: driver.plugin.serving) if cfg.metrics_port else None
    driver.start()
    log.info("DRA driver for node %s serving in %s", cfg.node_name, cfg.plugin_dir)
    stopped.wait()
    log.info("stopping: closing the kubelet sockets")
    driver.stop()
    if ops:
        ops.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
