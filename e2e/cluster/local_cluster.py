"""The local cluster: a real control plane on 127.0.0.1 with KWOK GPU nodes.

`up` builds nothing when the binary cache is warm, generates certificates,
starts etcd, kube-apiserver, kube-controller-manager, the default
kube-scheduler, `infergrid-scheduler` and KWOK, waits for each to be ready,
writes a kubeconfig and creates the fleet's nodes. Each node then gets an
InferGrid device plugin on fake NVML, which publishes its GPU inventory and
usage as on a real GPU node (there is no kubelet to register with). `down`
stops all of them.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

from kubernetes import client, config

from images import cluster_binaries, tools
from infergrid.fleet import Fleet, FleetNode, load_fleet

from . import certs, components, fake_nodes, model_store, prometheus
from .node_images import node_images
from .processes import ClusterError, ProcessTable, wait_until
from .real_node import RealNodes, capacity_advertised, capacity_withdrawn

REPO = Path(__file__).resolve().parents[2]
DEFAULT_FLEET = REPO / "e2e" / "fleets" / "sample.yaml"


def state_dir() -> Path:
    return Path(os.environ.get("INFERGRID_CLUSTER_DIR", REPO / ".cluster"))


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def url_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    """200 from `url`; anything else raises, which `wait_until` reads as not ready yet."""
    with urllib.request.urlopen(url, context=context, timeout=2) as resp:
        return resp.status == 200


def _insecure() -> ssl.SSLContext:
    """Components serve health on self-signed certs; only liveness is read from them."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _healthz(port: int) -> Callable[[], bool]:
    """Readiness of a component serving /healthz over HTTPS on `port`."""
    return lambda: url_ok(f"https://127.0.0.1:{port}/healthz", _insecure())


class LocalCluster:
    def __init__(self, state: Path | None = None):
        self.state = state or state_dir()
        self.processes = ProcessTable(self.state)
        self.real_nodes = RealNodes(self.state, self.processes, cluster_binaries.cache_dir())
        # What `down` could not put back on the machine; empty after a clean stop.
        self.leftovers: list[str] = []

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    def is_running(self) -> bool:
        """True when a cluster from this state folder answers /readyz."""
        if not self.kubeconfig.exists() or not self.processes.alive("kube-apiserver"):
            return False
        try:
            return self._apiserver_ready(self._load_layout())
        except Exception:  # noqa: BLE001 - anything short of ready means not running
            return False

    def up(
        self, fleet_file: Path = DEFAULT_FLEET, extender_url: str | None = None,
        for_chart: bool = False, prometheus: bool = False,
    ) -> float:  # fmt: skip
        """Starts the whole cluster and returns the seconds it took.

        The extender URL is where infergrid-scheduler looks for the extender;
        by default a free port on 127.0.0.1, recorded in the layout. `for_chart` leaves
        out what the Helm chart installs itself: the cluster's own infergrid-scheduler and
        the real node's device plugin process (the chart's DaemonSet serves that node). The
        KWOK nodes' plugins still run as processes: KWOK starts no containers. `prometheus`
        starts a Prometheus that scrapes the cluster (e2e/cluster/prometheus.py).
        """
        fleet = load_fleet(fleet_file)
        started = time.monotonic()
        if self.is_running():
            raise ClusterError(f"a cluster is already running from {self.state}; run down first")
        self.down()
        bins = cluster_binaries.ensure_built()
        for stale in ("etcd", "serving", "certs", "prometheus"):
            shutil.rmtree(self.state / stale, ignore_errors=True)
        self.state.mkdir(parents=True, exist_ok=True)
        layout = components.Layout(
            self.state,
            certs.generate(self.state / "certs"),
            bins,
            *(ports := _free_ports(8))[:7],
            extender_url or f"http://127.0.0.1:{ports[7]}/",
        )
        self._save_layout(layout)
        self.kubeconfig.write_text(components.kubeconfig(layout))
        self.kubeconfig.chmod(0o600)
        (self.state / "infergrid-scheduler.yaml").write_text(
            components.infergrid_scheduler_config(layout)
        )
        try:
            self._start(layout, for_chart)
            fake_nodes.create(self.api(), fleet)
            fake_nodes.wait_schedulable(self.api(), self.processes)
            if real := [node for node in fleet.nodes if node.real]:
                self.real_nodes.up(layout, self.api(), real, *node_images())
                model_store.provide(self.api(), "default", real[0].name)
            ports = self._start_device_plugins(fleet, fleet_file, for_chart, prometheus)
            if prometheus:
                self._start_prometheus(ports)
        except BaseException:
            self.down()
            raise
        return time.monotonic() - started

    def _start_device_plugins(
        self, fleet: Fleet, fleet_file: Path, for_chart: bool, metrics: bool
    ) -> dict[str, int]:
        """One device plugin per node on fake NVML. A KWOK node's only publishes (no kubelet
        dials it); a real node's registers with the kubelet, which then advertises its GPUs.
        With `for_chart`, real nodes get none: the chart's DaemonSet runs there. With
        `metrics`, each serves /metrics on a free port; returns node -> port."""
        if for_chart:
            fleet = replace(fleet, nodes=tuple(n for n in fleet.nodes if not n.real))
        names = [node.name for node in fleet.nodes]
        ports = dict(zip(names, _free_ports(len(names)), strict=True)) if metrics else {}
        for node in fleet.nodes:
            self.processes.start(
                f"device-plugin-{node.name}",
                components.device_plugin_command(
                    fleet_file, node, self.state, ports.get(node.name, 0)
                ),
                env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
            )
        fake_nodes.wait_published(self.api(), fleet, self.processes)
        core = client.CoreV1Api(self.api())
        for node in fleet.nodes:
            if node.real:
                wait_until(
                    lambda n=node: capacity_advertised(core, n),
                    30,
                    f"the kubelet of {node.name} to advertise its GPUs",
                    lambda n=node: self.processes.check_alive(f"device-plugin-{n.name}"),
                )
        return ports

    def _start_prometheus(self, plugin_ports: dict[str, int]) -> None:
        """Debian's prometheus (installed when missing), scraping this cluster."""
        tools.require(["prometheus"], lambda line: print(f"[cluster] {line}", flush=True))
        folder = self.state / "prometheus"
        config_file = prometheus.write_config(folder, plugin_ports)
        self.processes.start(
            "prometheus-targets",
            [sys.executable, "-m", "e2e.cluster.prometheus", str(self.kubeconfig), str(folder)],
        )
        port = _free_ports(1)[0]
        argv = prometheus.command(shutil.which("prometheus") or "prometheus", config_file, folder,
                                  port)  # fmt: skip
        self._start_ready("prometheus", argv, lambda: url_ok(f"http://127.0.0.1:{port}/-/ready"))
        (folder / "url").write_text(f"http://127.0.0.1:{port}")

    def prometheus_url(self) -> str | None:
        """Where this cluster's Prometheus answers; None when it runs none."""
        path = self.state / "prometheus" / "url"
        if not path.exists() or not self.processes.alive("prometheus"):
            return None
        return path.read_text().strip()

    @contextmanager
    def host_device_plugin_stopped(self, node: FleetNode) -> Iterator[None]:
        """The real node's device plugin process stopped for a while: what lets the chart's
        DaemonSet serve that node's GPUs instead. Started again, and advertising, after."""
        name = f"device-plugin-{node.name}"
        argv = self.processes.argv(name)
        self.processes.stop(name)
        core = client.CoreV1Api(self.api())
        wait_until(lambda: capacity_withdrawn(core, node), 60, f"the kubelet to see {name} go")
        try:
            yield
        finally:
            self.processes.start(name, argv, env={**os.environ, "KUBECONFIG": str(self.kubeconfig)})
            wait_until(lambda: capacity_advertised(core, node), 60, f"{name} registered again")

    def start_scheduler(self, name: str, profile: dict) -> None:
        """One more kube-scheduler, bound to the same extender, with its own profile: how a
        benchmark compares scheduling settings on one cluster. Stopped with the cluster."""
        layout = self._load_layout()
        path = self.state / f"{name}.yaml"
        path.write_text(components.infergrid_scheduler_config(layout, profile))
        port = _free_ports(1)[0]
        self._start_ready(name, components.scheduler_command(layout, path, port), _healthz(port))

    def extender_url(self) -> str:
        return self._load_layout().extender_url

    def down(self) -> list[str]:
        """Stops every process, real nodes first (while the API server still answers), and
        puts the machine back; what could not be put back is in `leftovers`."""
        self.leftovers = self.real_nodes.down()
        return self.processes.stop_all()

    def api(self) -> client.ApiClient:
        return config.new_client_from_config(str(self.kubeconfig))

    @contextmanager
    def stopped(self, name: str, timeout: float = 120) -> Iterator[None]:
        """One control-plane process (etcd, kube-apiserver, a scheduler...) down for as long
        as the block runs, as a crash or an upgrade takes it down: then started again with
        its own command line, and the API server ready (/readyz) again, before this returns.
        What the fault tests inject; whatever talks to the API server must ride it out."""
        layout = self._load_layout()
        ready = self._ready_checks(layout)[name]
        argv = self.processes.argv(name)
        self.processes.stop(name)
        try:
            yield
        finally:
            self.processes.start(name, argv)
            wait_until(ready, timeout, f"{name} ready again",
                       lambda: self.processes.check_alive(name))  # fmt: skip
            wait_until(lambda: self._apiserver_ready(layout), timeout, "the API server's /readyz")

    def _start(self, layout: components.Layout, for_chart: bool) -> None:
        argv = components.commands(layout)
        if for_chart:
            del argv["infergrid-scheduler"]  # the chart's scheduler Deployment takes the name
        ready = self._ready_checks(layout)
        for name, args in argv.items():
            self._start_ready(name, args, ready[name])
        wait_until(
            lambda: client.CoreV1Api(self.api()).read_namespaced_service_account(
                "default", "default"
            ),
            60,
            "the default ServiceAccount",
        )

    def _ready_checks(self, layout: components.Layout) -> dict[str, Callable[[], bool]]:
        """How each control-plane process says it is ready."""
        return {
            "etcd": lambda: url_ok(f"http://127.0.0.1:{layout.etcd_port}/health"),
            "kube-apiserver": lambda: self._apiserver_ready(layout),
            "kube-controller-manager": _healthz(layout.controller_manager_port),
            "kube-scheduler": _healthz(layout.scheduler_port),
            "infergrid-scheduler": _healthz(layout.infergrid_scheduler_port),
            "kwok": lambda: url_ok(f"http://127.0.0.1:{layout.kwok_port}/healthz"),
        }

    def _start_ready(self, name: str, argv: list[str], ready: Callable[[], bool]) -> None:
        """Starts a process and waits until it answers ready; fails at once if it exits."""
        self.processes.start(name, argv)
        wait_until(ready, 60, f"{name} to be ready", lambda: self.processes.check_alive(name))

    def _apiserver_ready(self, layout: components.Layout) -> bool:
        ctx = ssl.create_default_context(cafile=str(layout.certs.ca_cert))
        ctx.load_cert_chain(str(layout.certs.admin_cert), str(layout.certs.admin_key))
        return url_ok(f"{layout.server}/readyz", ctx)

    def _save_layout(self, layout: components.Layout) -> None:
        data = asdict(layout)
        (self.state / "layout.json").write_text(json.dumps(data, default=str, indent=1))

    def _load_layout(self) -> components.Layout:
        data = json.loads((self.state / "layout.json").read_text())
        data["state"] = Path(data["state"])
        data["certs"] = certs.CertPaths(**{k: Path(v) for k, v in data["certs"].items()})
        data["bins"] = {k: Path(v) for k, v in data["bins"].items()}
        return components.Layout(**data)
