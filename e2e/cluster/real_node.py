"""Real nodes: a kubelet with containerd, runc and a CNI bridge on this machine.

Where KWOK only pretends, a real node starts containers: the chart's images run, the device
plugin registers with a real kubelet over its unix socket, engine pods serve. A real node
changes machine-wide state (sysctls, iptables, mounts, a bridge, cgroups), so `up` first
records that state and `down` puts it back, then says what, if anything, still differs.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from kubernetes import client
from kubernetes.client.rest import ApiException

from images import cluster_binaries
from infergrid.fleet import FleetNode
from infergrid.inventory import node_capacity

from . import certs, components, machine_state, node_runtime
from .node_configs import (
    KUBELET_ROOT,
    REAL_NODE_LABEL,
    NodeLayout,
    cni_config,
    containerd_config,
    kubelet_config,
)
from .processes import ClusterError, ProcessTable, wait_until

RUN_ROOT = Path("/run/infergrid")
STORE = "real-node-v2"  # the one containerd 2 root under $INFERGRID_CACHE/containerd
CTR = str(cluster_binaries.paths()["ctr"])
"""containerd 2's own client, built with it."""
NODE_ROLE_BINDING = "infergrid-local:nodes"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"

# Loads the images a node needs into its containerd, given the containerd socket.
ImageLoader = Callable[[Path], None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(argv: list[str], what: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise ClusterError(f"{what} failed: {' '.join(argv)}\n{done.stderr.strip()[-1500:]}")
    return done.stdout


class RealNodes:
    """The real nodes of one local cluster, their processes kept in its process table."""

    def __init__(self, state: Path, processes: ProcessTable, cache: Path):
        self.state = state
        self.processes = processes
        self.cache = cache

    @property
    def store(self) -> Path:
        """containerd's root, kept between clusters so images are imported once: one for
        every real node name, since one real node runs per machine."""
        return self.cache / "containerd" / STORE

    def _drop_other_stores(self) -> None:
        """Removes containerd roots this cluster does not use (earlier layouts kept one per
        node name): each holds gigabytes of image layers. No containerd runs on them: one
        real node runs per machine, and this is checked before."""
        for old in (self.cache / "containerd").glob("*"):
            if old != self.store and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)

    @property
    def _before_path(self) -> Path:
        return self.state / "machine-before.json"

    def layout(self, node: FleetNode, index: int, sandbox_image: str) -> NodeLayout:
        return NodeLayout(
            name=node.name,
            index=index,
            run_dir=RUN_ROOT / node.name,
            state_dir=self.state / "nodes" / node.name,
            containerd_root=self.store,
            kubelet_port=_free_port(),
            kubelet_healthz_port=_free_port(),
            sandbox_image=sandbox_image,
        )

    def up(
        self,
        cluster: components.Layout,
        api: client.ApiClient,
        nodes: list[FleetNode],
        sandbox_image: str,
        load_images: ImageLoader,
    ) -> list[NodeLayout]:
        """Starts every real node and waits until each is Ready and untainted."""
        if len(nodes) > 1:
            raise ClusterError(
                "one real node per machine: every kubelet serves device plugins at "
                "/var/lib/kubelet/device-plugins; mark one fleet entry `kubelet: real`"
            )
        node_runtime.check_machine()
        if RUN_ROOT.exists() and any(RUN_ROOT.iterdir()):
            raise ClusterError(
                f"a real node of another local cluster is running ({RUN_ROOT} is in use): one "
                "real node per machine; stop that cluster first (make cluster-down or "
                "make demo-down)"
            )
        node_runtime.ensure()
        self._drop_other_stores()
        machine_state.save(machine_state.snapshot(), self._before_path)
        _bind_nodes(api)
        layouts = [self.layout(n, i, sandbox_image) for i, n in enumerate(nodes)]
        for layout in layouts:
            self._start(layout, cluster, load_images)
        for layout in layouts:
            wait_until(
                lambda name=layout.name: _ready(client.CoreV1Api(api), name),
                120,
                f"real node {layout.name} to be Ready",
                lambda name=layout.name: self.processes.check_alive(f"kubelet-{name}"),
            )
        return layouts

    def _start(self, node: NodeLayout, cluster: components.Layout, load: ImageLoader) -> None:
        for folder in (node.run_dir, node.state_dir, node.cni_conf_dir, node.containerd_root):
            folder.mkdir(parents=True, exist_ok=True)
        _bridge_up(node)
        _service_to_apiserver(node, cluster.apiserver_port)
        node.containerd_config.write_text(containerd_config(node))
        (node.cni_conf_dir / "10-infergrid.conflist").write_text(cni_config(node))
        # containerd finds its runc shim on PATH: the one built beside it.
        binary = cluster.bins["containerd"]
        self.processes.start(
            f"containerd-{node.name}",
            [str(binary), f"--config={node.containerd_config}"],
            env={**os.environ, "PATH": f"{binary.parent}:{os.environ.get('PATH', '')}"},
        )
        wait_until(
            lambda: _ctr(node, "version") is not None,
            30,
            f"containerd of {node.name}",
            lambda: self.processes.check_alive(f"containerd-{node.name}"),
        )
        load(node.containerd_socket)
        cert, key = certs.client_cert(
            cluster.certs, node.state_dir, "kubelet", f"system:node:{node.name}", "system:nodes"
        )
        node.kubelet_kubeconfig.write_text(
            components.client_kubeconfig(cluster.server, cluster.certs.ca_cert, cert, key)
        )
        node.kubelet_config.write_text(kubelet_config(node, cluster.certs.ca_cert))
        self.processes.start(
            f"kubelet-{node.name}",
            [
                str(cluster.bins["kubelet"]),
                f"--config={node.kubelet_config}",
                f"--kubeconfig={node.kubelet_kubeconfig}",
                f"--root-dir={KUBELET_ROOT}",
                f"--cert-dir={node.state_dir / 'pki'}",
                f"--hostname-override={node.name}",
                f"--node-ip={node.node_ip}",
                f"--node-labels={REAL_NODE_LABEL}=true",
            ],
        )

    def restart_kubelet(self, name: str) -> None:
        """What a node upgrade or a kubelet crash does: the pods' containers keep running."""
        self.processes.restart(f"kubelet-{name}")

    def restart_containerd(self, name: str) -> None:
        """What `systemctl restart containerd` does on a node, whose unit has KillMode=process:
        containerd alone goes and comes back. Its shims, each started in a process group of
        its own, are not in containerd's group that `stop` signals, so they and the
        containers they hold keep running, and the new containerd reconnects to them."""
        self.processes.restart(f"containerd-{name}")
        socket_path = RUN_ROOT / name / "containerd.sock"
        wait_until(
            lambda: _ctr_at(socket_path, "version") is not None,
            30,
            f"containerd of {name} back",
            lambda: self.processes.check_alive(f"containerd-{name}"),
        )

    def running_containers(self, name: str) -> set[str]:
        """Ids of the containers the node's containerd runs now, as its own tasks list says
        (what it re-attached to after a restart, apart from what the kubelet last reported)."""
        out = _ctr_at(RUN_ROOT / name / "containerd.sock", "tasks", "ls") or ""
        rows = [line.split() for line in out.splitlines()[1:]]
        return {row[0] for row in rows if len(row) >= 3 and row[2] == "RUNNING"}

    def down(self) -> list[str]:
        """Stops this cluster's real nodes and puts the machine back; returns what still
        differs. Another cluster's real node is never touched."""
        names = sorted(p.name for p in (self.state / "nodes").glob("*")) if self._ran else []
        for name in names:
            self.processes.stop(f"kubelet-{name}")
        for name in names:
            _remove_containers(RUN_ROOT / name / "containerd.sock")
            self.processes.stop(f"containerd-{name}")
        if names:
            _kill_leftovers([RUN_ROOT / name for name in names])
        before = machine_state.load(self._before_path)
        if before is None:
            return []
        left = machine_state.restore(before)
        if not left:
            self._before_path.unlink()
            shutil.rmtree(self.state / "nodes", ignore_errors=True)
        return left

    @property
    def _ran(self) -> bool:
        return self._before_path.exists()


def _bind_nodes(api: client.ApiClient) -> None:
    """The local API server authorizes by RBAC alone (no Node authorizer): kubelets get the
    `system:node` role through their group."""
    rbac = client.RbacAuthorizationV1Api(api)
    body = {
        "metadata": {"name": NODE_ROLE_BINDING},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "system:node"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": "system:nodes"}],
    }  # fmt: skip
    try:
        rbac.create_cluster_role_binding(body)
    except ApiException as err:
        if err.status != 409:
            raise


def _bridge_up(node: NodeLayout) -> None:
    """The node's bridge, addressed with the node IP before any pod exists; route_localnet
    lets pods reach the API server on 127.0.0.1 (see `_service_to_apiserver`)."""
    _run(["ip", "link", "add", node.bridge, "type", "bridge"], "creating the node's bridge")
    _run(["ip", "addr", "add", f"{node.node_ip}/{node.subnet.prefixlen}", "dev", node.bridge],
         "addressing the node's bridge")  # fmt: skip
    _run(["ip", "link", "set", node.bridge, "up"], "bringing the node's bridge up")
    Path(f"/proc/sys/net/ipv4/conf/{node.bridge}/route_localnet").write_text("1")


def _service_to_apiserver(node: NodeLayout, apiserver_port: int) -> None:
    """Pods find the API server at the `kubernetes` Service's IP; with no kube-proxy, one DNAT
    rule on the node's bridge sends it to the API server on loopback."""
    _run(
        ["iptables", "-w", "-t", "nat", "-A", "PREROUTING", "-i", node.bridge,
         "-d", certs.SERVICE_IP, "-p", "tcp", "--dport", "443",
         "-j", "DNAT", "--to-destination", f"127.0.0.1:{apiserver_port}"],
        "routing the kubernetes Service to the API server",
    )  # fmt: skip


def _ctr(node: NodeLayout, *args: str) -> str | None:
    return _ctr_at(node.containerd_socket, *args)


def _ctr_at(socket_path: Path, *args: str) -> str | None:
    done = subprocess.run(
        [CTR, "--address", str(socket_path), "-n", "k8s.io", *args],
        capture_output=True,
        text=True,
    )
    return done.stdout if done.returncode == 0 else None


def _remove_containers(socket_path: Path) -> None:
    """Kills and removes every container of a node's containerd, while it still runs."""
    if not socket_path.exists():
        return
    ctr = [CTR, "--address", str(socket_path), "-n", "k8s.io"]

    def ids(kind: str) -> list[str]:
        done = subprocess.run([*ctr, kind, "ls", "-q"], capture_output=True, text=True)
        return done.stdout.split() if done.returncode == 0 else []

    for task in ids("tasks"):
        subprocess.run([*ctr, "tasks", "kill", "-s", "SIGKILL", task], capture_output=True)
    for task in ids("tasks"):
        subprocess.run([*ctr, "tasks", "rm", "-f", task], capture_output=True)
    for container in ids("containers"):
        subprocess.run([*ctr, "containers", "rm", container], capture_output=True)


def _kill_leftovers(run_dirs: list[Path]) -> None:
    """Whatever outlived containerd: processes in the kubelet's pod cgroups, and shims that
    serve one of these nodes' containerds."""
    pids = set(_pod_cgroup_pids())
    pids |= {pid for pid, argv in _processes() if _is_our_shim(argv, run_dirs)}
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)


def _pod_cgroup_pids() -> Iterable[int]:
    for procs in Path("/sys/fs/cgroup/pids").glob("kubepods*/**/cgroup.procs"):
        for line in procs.read_text().split():
            yield int(line)


def _processes() -> Iterable[tuple[int, list[str]]]:
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = proc.joinpath("cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            yield int(proc.name), [a.decode(errors="replace") for a in argv]


def _is_our_shim(argv: list[str], run_dirs: list[Path]) -> bool:
    return (
        bool(argv)
        and argv[0].endswith("containerd-shim-runc-v2")
        and any(a.startswith(str(d)) for a in argv for d in run_dirs)
    )


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _ready(core: client.CoreV1Api, name: str) -> bool:
    node = core.read_node(name)
    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
    return ready and not any(t.key == NOT_READY_TAINT for t in node.spec.taints or [])


def capacity_advertised(core: client.CoreV1Api, node: FleetNode) -> bool:
    """True once the kubelet reports every GPU resource the node's device plugin serves as
    allocatable: a plugin that went away leaves its capacity but takes its allocatable."""
    status = core.read_node(node.name).status
    wanted = node_capacity(node.inventory)
    return all(
        (status.capacity or {}).get(name) == value == (status.allocatable or {}).get(name)
        for name, value in wanted.items()
    )


def capacity_withdrawn(core: client.CoreV1Api, node: FleetNode) -> bool:
    """True once the kubelet reports none of the plugin's GPU resources allocatable: it saw
    the plugin go. Until then its node status is older than the plugin's stop, and a
    `capacity_advertised` read after a restart could be that stale status."""
    allocatable = core.read_node(node.name).status.allocatable or {}
    return all(allocatable.get(name, "0") == "0" for name in node_capacity(node.inventory))
