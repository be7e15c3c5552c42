"""Config files of a real node: containerd, the CNI network, the kubelet.

Pure functions of a `NodeLayout`, so what a real node runs with can be read and tested
apart from starting it. The settings this machine class needs are each explained where
they are set.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from infergrid import dra

# Real nodes take their pod subnets from here, one /24 each; the first address of a node's
# subnet is its bridge's and the node's own IP (the kubelet refuses a loopback node IP).
REAL_NODE_CIDR = ipaddress.ip_network("10.85.0.0/16")
# Where the kubelet's device manager and every device plugin meet; the kubelet does not let
# this move with its root directory.
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_ROOT = Path("/var/lib/kubelet")
CNI_BIN_DIR = Path("/usr/lib/cni")
# Where containerd reads CDI specs from, and the DRA driver writes the ones it prepares.
CDI_DIR = Path("/var/run/cdi")
# Every real node carries this label, so a pod (or a test) can ask for one.
REAL_NODE_LABEL = "infergrid.io/real-node"


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """Where one real node keeps what it needs, and how it is reached."""

    name: str
    index: int
    run_dir: Path  # short: containerd's socket lives here (unix socket paths are limited)
    state_dir: Path  # under the cluster's state folder: configs, logs
    containerd_root: Path  # in the cache, so imported images outlive the cluster
    kubelet_port: int
    kubelet_healthz_port: int
    sandbox_image: str

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return list(REAL_NODE_CIDR.subnets(new_prefix=24))[self.index]

    @property
    def node_ip(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def bridge(self) -> str:
        return f"infergrid{self.index}"

    @property
    def containerd_socket(self) -> Path:
        return self.run_dir / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.state_dir / "containerd.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.state_dir / "cni"

    @property
    def kubelet_config(self) -> Path:
        return self.state_dir / "kubelet.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.state_dir / "kubelet.kubeconfig"


def _toml(value: object) -> str:
    """A TOML value; JSON's string, number and array forms are valid TOML for what is used here."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value) if isinstance(value, Path) else value)


def containerd_config(node: NodeLayout) -> str:
    """containerd 2 (config version 3) with the CRI plugins for one node.

    - `enable_cdi`: a DRA driver's prepared devices reach the container as CDI devices, read
      from `CDI_DIR` (containerd 2 turns CDI on by default; it is set here to say so);
    - `restrict_oom_score_adj`: without CAP_SYS_RESOURCE every sandbox fails with
      "can't get final child's PID from pipe: EOF" when runc writes oom_score_adj;
    - `disable_apparmor`: the machine has no AppArmor;
    - `SystemdCgroup = false`: there is no systemd, the kubelet uses cgroupfs too;
    - the `opt` plugin is pointed into the node's own folder, not /opt/containerd, and pod
      network namespaces are mounted under the node's state, not /run/netns.
    """
    runtime, images = (
        'plugins."io.containerd.cri.v1.runtime"',
        'plugins."io.containerd.cri.v1.images"',
    )
    sections = {
        "": {
            "version": 3,
            "root": node.containerd_root,
            "state": node.run_dir / "state",
        },
        "grpc": {"address": node.containerd_socket},
        "ttrpc": {"address": node.run_dir / "ttrpc.sock"},
        'plugins."io.containerd.internal.v1.opt"': {"path": node.containerd_root / "opt"},
        images: {"snapshotter": "overlayfs"},
        f"{images}.pinned_images": {"sandbox": node.sandbox_image},
        runtime: {
            "enable_cdi": True,
            "cdi_spec_dirs": [CDI_DIR],
            "restrict_oom_score_adj": True,
            "disable_apparmor": True,
            "enable_selinux": False,
            "netns_mounts_under_state_dir": True,
        },
        f"{runtime}.containerd": {"default_runtime_name": "runc"},
        f"{runtime}.containerd.runtimes.runc": {"runtime_type": "io.containerd.runc.v2"},
        f"{runtime}.containerd.runtimes.runc.options": {"SystemdCgroup": False},
        f"{runtime}.cni": {
            "bin_dirs": [CNI_BIN_DIR],
            "conf_dir": node.cni_conf_dir,
            "max_conf_num": 1,
        },
    }
    lines = []
    for section, values in sections.items():
        if section:
            lines.append(f"\n[{section}]")
        lines += [f"{key} = {_toml(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def cni_config(node: NodeLayout) -> str:
    """A bridge network with host-local addresses from the node's subnet.

    The bridge is made and addressed before the kubelet starts (the node IP lives on it), so
    the plugin is not a gateway: as one it would turn on IP forwarding machine-wide. Pods get
    their default route through the bridge's address by IPAM instead.
    """
    gateway = node.node_ip
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "infergrid",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": node.bridge,
                    "isGateway": False,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(node.subnet), "gateway": gateway}]],
                        "routes": [{"dst": "0.0.0.0/0", "gw": gateway}],
                        "dataDir": str(node.run_dir / "ipam"),
                    },
                }
            ],
        },
        indent=1,
    )


def kubelet_config(node: NodeLayout, ca_cert: Path) -> str:
    """KubeletConfiguration for this machine class: cgroup v1 without systemd, a kubelet
    that serves on the node IP, authenticates the API server by the cluster CA and asks it
    to authorize every call, and never evicts or garbage-collects the images it was given."""
    return yaml.safe_dump(
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
            "address": node.node_ip,
            "port": node.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": node.kubelet_healthz_port,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "registerNode": True,
            "resolvConf": "",
            "imageGCHighThresholdPercent": 100,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "4s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "featureGates": dict(dra.FEATURE_GATES),
        },
        sort_keys=False,
    )
