"""Command lines and config files of the local control plane's processes.

Pure functions of a `Layout` (ports and file paths), so what runs can be read
and tested apart from starting it.
"""

from __future__ import annotations

import base64
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from infergrid import constants, dra, mig
from infergrid.fleet import FleetNode

from .certs import SERVICE_CIDR, CertPaths
from .node_configs import DEVICE_PLUGIN_DIR

POD_CIDR = "10.244.0.0/16"


@dataclass(frozen=True, slots=True)
class Layout:
    state: Path
    certs: CertPaths
    bins: dict[str, Path]
    etcd_port: int
    etcd_peer_port: int
    apiserver_port: int
    controller_manager_port: int
    scheduler_port: int
    infergrid_scheduler_port: int
    kwok_port: int
    extender_url: str

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"


def kubeconfig(layout: Layout) -> str:
    """An admin kubeconfig with the certificates inlined, so it can be copied."""
    c = layout.certs
    return client_kubeconfig(layout.server, c.ca_cert, c.admin_cert, c.admin_key)


def client_kubeconfig(server: str, ca_cert: Path, cert: Path, key: Path) -> str:
    """A kubeconfig that authenticates by a client certificate, inlined."""

    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "infergrid-local",
                    "cluster": {
                        "server": server,
                        "certificate-authority-data": b64(ca_cert),
                    },
                }
            ],
            "users": [
                {
                    "name": "infergrid-admin",
                    "user": {
                        "client-certificate-data": b64(cert),
                        "client-key-data": b64(key),
                    },
                }
            ],
            "contexts": [
                {
                    "name": "infergrid-local",
                    "context": {"cluster": "infergrid-local", "user": "infergrid-admin"},
                }
            ],
            "current-context": "infergrid-local",
        }
    )


def extender_resources() -> list[str]:
    """Every extended resource whose placement the extender decides."""
    return [
        constants.RESOURCE_GPU,
        constants.RESOURCE_VGPU,
        constants.RESOURCE_GPU_MEMORY,
        constants.RESOURCE_GPU_CORES,
        dra.RESOURCE_GPU_CLAIM,
        *sorted({constants.mig_resource(p) for f in mig.MIG_FAMILIES for p in f.profiles}),
    ]


# Score plugins that place by a policy of their own (emptiest node, balanced use, replicas of
# one owner spread over nodes): for InferGrid pods the InferenceService's policy, carried out by
# the extender, decides, and these would pull a binpack burst across the fleet.
PLACEMENT_SCORERS_OFF = ("NodeResourcesFit", "NodeResourcesBalancedAllocation")


def infergrid_profile(scheduler_name: str) -> dict:
    """The one profile of infergrid-scheduler: the extender's score decides among the nodes
    that pass; taints, affinity and a pod's own topology spread constraints still count, but
    not the system-default spreading of a Deployment's replicas."""
    return {
        "schedulerName": scheduler_name,
        "plugins": {"score": {"disabled": [{"name": name} for name in PLACEMENT_SCORERS_OFF]}},
        "pluginConfig": [
            {"name": "PodTopologySpread",
             "args": {"defaultingType": "List", "defaultConstraints": []}},
        ],
    }  # fmt: skip


def infergrid_scheduler_config(layout: Layout, profile: dict | None = None) -> str:
    """KubeSchedulerConfiguration of the second scheduler, bound to the extender.

    Extenders apply to every profile of a scheduler process, so this runs as
    its own process with one profile. `gpu-memory` and `gpu-cores` are never
    advertised by a node, so kube-scheduler must ignore them. `profile` replaces
    InferGrid's own (a benchmark's stock-scoring scheduler).
    """
    ignored = {constants.RESOURCE_GPU_MEMORY, constants.RESOURCE_GPU_CORES, dra.RESOURCE_GPU_CLAIM}
    return yaml.safe_dump(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(layout.kubeconfig)},
            "leaderElection": {"leaderElect": False},
            "percentageOfNodesToScore": 100,
            "profiles": [profile or infergrid_profile(constants.SCHEDULER_NAME)],
            "extenders": [
                {
                    "urlPrefix": layout.extender_url,
                    "filterVerb": "filter",
                    "prioritizeVerb": "prioritize",
                    "preemptVerb": "preempt",
                    "bindVerb": "bind",
                    "weight": 1,
                    "nodeCacheCapable": True,
                    "enableHTTPS": False,
                    "httpTimeout": "10s",
                    "ignorable": False,
                    "managedResources": [
                        {"name": name, "ignoredByScheduler": name in ignored}
                        for name in extender_resources()
                    ],
                }
            ],
        }
    )


def device_plugin_command(
    fleet_file: Path, node: FleetNode, state: Path, metrics_port: int = 0
) -> list[str]:
    """InferGrid's device plugin for one node on fake NVML: on a real node it serves in the
    kubelet's own device-plugin folder and reads that kubelet's PodResources; on a KWOK
    node, in a folder no kubelet reads, and with no PodResources (the real node's kubelet
    socket on this machine is not its kubelet's). Its /metrics on `metrics_port` (0: none)."""
    plugin_dir = DEVICE_PLUGIN_DIR if node.real else state / "kubelet" / node.name
    pod_resources = [] if node.real else ["--pod-resources-socket="]
    return [
        sys.executable,
        "-m",
        "device_plugin.main",
        f"--fake-fleet={fleet_file}",
        f"--node={node.name}",
        f"--plugin-dir={plugin_dir}",
        f"--vgpu-slots-per-gpu={node.vgpu_slots_per_gpu}",
        f"--gpu-replicas={node.time_slices}",
        f"--metrics-port={metrics_port}",
        "--usage-interval=2",
        *pod_resources,
    ]


def scheduler_command(layout: Layout, config: Path, port: int) -> list[str]:
    """A kube-scheduler run from a KubeSchedulerConfiguration file."""
    return [
        str(layout.bins["kube-scheduler"]),
        f"--config={config}",
        dra.feature_gates_flag(),
        *_serving(port, layout),
    ]


def _serving(port: int, layout: Layout) -> list[str]:
    kc = str(layout.kubeconfig)
    return [
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        f"--cert-dir={layout.state / 'serving' / str(port)}",
    ]


def commands(layout: Layout) -> dict[str, list[str]]:
    """Process name to argv, in start order."""
    b, c, s = layout.bins, layout.certs, layout.state
    peer = f"http://127.0.0.1:{layout.etcd_peer_port}"
    etcd_url = f"http://127.0.0.1:{layout.etcd_port}"
    return {
        "etcd": [
            str(b["etcd"]),
            "--name=local",
            f"--data-dir={s / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=local={peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
        "kube-apiserver": [
            str(b["kube-apiserver"]),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={layout.apiserver_port}",
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={c.server_cert}",
            f"--tls-private-key-file={c.server_key}",
            f"--client-ca-file={c.ca_cert}",
            f"--service-account-key-file={c.sa_pub}",
            f"--service-account-signing-key-file={c.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            # A real node is dialled at its InternalIP (there is no DNS for node names), as
            # an admin for logs, exec and port-forward.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--kubelet-client-certificate={c.admin_cert}",
            f"--kubelet-client-key={c.admin_key}",
            dra.feature_gates_flag(),
        ],
        "kube-controller-manager": [
            str(b["kube-controller-manager"]),
            f"--kubeconfig={layout.kubeconfig}",
            *_serving(layout.controller_manager_port, layout),
            "--leader-elect=false",
            f"--service-account-private-key-file={c.sa_key}",
            f"--root-ca-file={c.ca_cert}",
            f"--cluster-signing-cert-file={c.ca_cert}",
            f"--cluster-signing-key-file={c.ca_key}",
            "--controllers=*,-nodeipam",
            "--node-monitor-grace-period=2m",
            dra.feature_gates_flag(),
        ],
        "kube-scheduler": [
            str(b["kube-scheduler"]),
            f"--kubeconfig={layout.kubeconfig}",
            *_serving(layout.scheduler_port, layout),
            "--leader-elect=false",
            dra.feature_gates_flag(),
        ],
        "infergrid-scheduler": scheduler_command(
            layout, s / "infergrid-scheduler.yaml", layout.infergrid_scheduler_port
        ),
        "kwok": [
            str(b["kwok"]),
            f"--kubeconfig={layout.kubeconfig}",
            f"--config={b['kwok-stages']}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--server-address=127.0.0.1:{layout.kwok_port}",
            f"--cidr={POD_CIDR}",
            "--node-ip=127.0.0.1",
            "--node-lease-duration-seconds=40",
        ],
    }
