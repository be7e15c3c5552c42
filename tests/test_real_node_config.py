"""What a real node runs with, and how `down` undoes what it changed, read without a node."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import yaml

from e2e.cluster import machine_state, node_configs
from e2e.cluster.machine_state import MachineState


def node(tmp_path: Path, index: int = 0) -> node_configs.NodeLayout:
    return node_configs.NodeLayout(
        name="local-a100",
        index=index,
        run_dir=Path("/run/infergrid/local-a100"),
        state_dir=tmp_path / "nodes" / "local-a100",
        containerd_root=tmp_path / "cache" / "containerd",
        kubelet_port=20250,
        kubelet_healthz_port=20248,
        sandbox_image="docker.io/infergrid/pause:abc",
    )


def test_each_node_has_its_own_subnet_and_a_non_loopback_ip_on_its_bridge(tmp_path):
    first, second = node(tmp_path, 0), node(tmp_path, 1)
    assert (first.node_ip, str(first.subnet)) == ("10.85.0.1", "10.85.0.0/24")
    assert (second.node_ip, second.bridge) == ("10.85.1.1", "infergrid1")


def test_containerd_runs_cri_as_this_machine_class_needs(tmp_path):
    config = tomllib.loads(node_configs.containerd_config(node(tmp_path)))
    assert config["version"] == 3
    assert config["grpc"]["address"] == "/run/infergrid/local-a100/containerd.sock"
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True  # no CAP_SYS_RESOURCE
    assert runtime["disable_apparmor"] is True
    assert runtime["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert runtime["cni"]["conf_dir"].endswith("nodes/local-a100/cni")
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == "docker.io/infergrid/pause:abc"
    # Nothing under /opt: the opt plugin keeps to the node's own folder.
    assert config["plugins"]["io.containerd.internal.v1.opt"]["path"].startswith(str(tmp_path))


def test_containerd_reads_the_cdi_specs_a_dra_driver_writes(tmp_path):
    runtime = tomllib.loads(node_configs.containerd_config(node(tmp_path)))["plugins"][
        "io.containerd.cri.v1.runtime"
    ]
    assert runtime["enable_cdi"] is True
    assert runtime["cdi_spec_dirs"] == [str(node_configs.CDI_DIR)]


def test_the_kubelet_turns_on_the_dra_gates_the_control_plane_has(tmp_path):
    config = yaml.safe_load(node_configs.kubelet_config(node(tmp_path), tmp_path / "ca.crt"))
    gates = {"DRAConsumableCapacity": True, "DRAPartitionableDevices": True}
    assert config["featureGates"] == gates


def test_the_cni_bridge_is_no_gateway_so_forwarding_stays_off(tmp_path):
    (bridge,) = json.loads(node_configs.cni_config(node(tmp_path)))["plugins"]
    assert bridge["type"] == "bridge" and bridge["bridge"] == "infergrid0"
    assert bridge["isGateway"] is False and bridge["ipMasq"] is False
    ipam = bridge["ipam"]
    assert ipam["ranges"] == [[{"subnet": "10.85.0.0/24", "gateway": "10.85.0.1"}]]
    assert ipam["routes"] == [{"dst": "0.0.0.0/0", "gw": "10.85.0.1"}]
    assert ipam["dataDir"].startswith("/run/infergrid/")


def test_the_kubelet_suits_cgroup_v1_without_systemd_and_authorizes_every_call(tmp_path):
    config = yaml.safe_load(node_configs.kubelet_config(node(tmp_path), tmp_path / "ca.crt"))
    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["address"] == "10.85.0.1"
    assert config["containerRuntimeEndpoint"] == "unix:///run/infergrid/local-a100/containerd.sock"
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["readOnlyPort"] == 0
    assert config["imageGCHighThresholdPercent"] == 100  # images built here cannot be pulled


BEFORE = """*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -s 192.0.2.9/32 -j DROP
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
COMMIT
"""

AFTER = """*filter
:INPUT ACCEPT [10:200]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [3:100]
:KUBE-FIREWALL - [0:0]
-A INPUT -s 192.0.2.9/32 -j DROP
-A INPUT -j KUBE-FIREWALL
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL -m conntrack --ctstate INVALID -j DROP
COMMIT
*nat
:PREROUTING ACCEPT [5:5]
-A PREROUTING -i infergrid0 -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j DNAT
COMMIT
"""


def test_iptables_undo_removes_only_what_was_added_rules_before_chains():
    undo = machine_state.iptables_undo(BEFORE, AFTER)
    assert undo == [
        ["-t", "filter", "-D", "INPUT", "-j", "KUBE-FIREWALL"],
        ["-t", "filter", "-D", "KUBE-FIREWALL", "-m", "conntrack", "--ctstate", "INVALID",
         "-j", "DROP"],
        ["-t", "filter", "-D", "OUTPUT", "-j", "KUBE-FIREWALL"],
        ["-t", "nat", "-D", "PREROUTING", "-i", "infergrid0", "-d", "10.96.0.1/32", "-p", "tcp",
         "-m", "tcp", "--dport", "443", "-j", "DNAT"],
        ["-t", "filter", "-F", "KUBE-FIREWALL"],
        ["-t", "filter", "-X", "KUBE-FIREWALL"],
    ]  # fmt: skip
    assert machine_state.iptables_undo(AFTER, AFTER) == []


def state(**changes) -> MachineState:
    base = {
        "sysctls": {"vm/overcommit_memory": "0", "kernel/panic": "0"},
        "iptables": {"iptables": BEFORE, "ip6tables": ""},
        "mounts": ["/", "/proc"],
        "links": ["eth0", "lo"],
        "cgroups": ["cpu/docker"],
        "dirs": [],
    }
    return MachineState(**(base | changes))


def test_differences_name_everything_a_kubelet_leaves_behind():
    after = state(
        sysctls={"vm/overcommit_memory": "1", "kernel/panic": "0"},
        iptables={"iptables": AFTER, "ip6tables": ""},
        mounts=["/", "/proc", "/var/lib/kubelet"],
        links=["eth0", "infergrid0", "lo"],
        cgroups=["cpu/docker", "cpu/kubepods"],
        dirs=["/var/lib/kubelet"],
    )
    found = machine_state.differences(state(), after)
    assert "sysctl vm/overcommit_memory: 0 then 1" in found
    assert "iptables -t filter: chain KUBE-FIREWALL" in found
    assert "mount left behind: /var/lib/kubelet" in found
    assert "link left behind: infergrid0" in found
    assert "cgroup left behind: cpu/kubepods" in found
    assert "dir left behind: /var/lib/kubelet" in found
    # Packet counters are not a difference.
    assert machine_state.differences(state(), state()) == []


def test_a_snapshot_round_trips_through_its_file(tmp_path):
    before = state()
    machine_state.save(before, tmp_path / "before.json")
    assert machine_state.load(tmp_path / "before.json") == before
    assert machine_state.load(tmp_path / "missing.json") is None
