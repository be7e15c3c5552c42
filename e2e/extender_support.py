"""Helpers for the extender's e2e tests: the extender process, pods, and the over-commit audit."""

from __future__ import annotations

import socket
import sys
import threading
import urllib.request
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

from kubernetes import client

from e2e.cluster import fake_nodes
from e2e.cluster.fake_nodes import KWOK_NODE_SELECTOR, KWOK_TOLERATION
from e2e.cluster.processes import wait_until
from e2e.part_process import PartProcess
from infergrid import constants
from infergrid.assignment_annotation import decode_assignment
from infergrid.fleet import FleetNode, parse_fleet
from infergrid.inventory import decode_inventory, encode_inventory
from infergrid.usage import GpuUsage, GpuUsageSample, encode_usage

BENCH_LEASE = ["--lease-namespace", "kube-system"]
"""A benchmark's extender, run with the admin's kubeconfig on a cluster of its own, elects on
a Lease in kube-system; the suite's holds its chart identity's Lease (e2e/identities.py)."""


class ExtenderProcess(PartProcess):
    """`infergrid-scheduler-extender` on the port infergrid-scheduler calls.

    `start` waits for /readyz, which only the Lease's holder answers; a standby replica
    (`standby=True`) is started once it is live (/healthz), since it leads only later.
    """

    def __init__(
        self,
        url: str,
        kubeconfig: Path,
        log: Path,
        lease: list[str],
        identity: str = "e2e-extender",
        standby: bool = False,
    ):
        self.port = urlparse(url).port
        probe = "healthz" if standby else "readyz"
        super().__init__("extender", kubeconfig, log, f"http://127.0.0.1:{self.port}/{probe}")
        self.lease = lease  # --lease-namespace, --lease-name: the one its identity may update
        self.identity = identity  # its holder name in the Lease: one per replica
        self.args: list[str] = []

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "scheduler_extender.main",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--identity", self.identity, *self.lease, *self.args,
        ]  # fmt: skip

    def leading(self) -> bool:
        """Whether its /readyz says 200: its cache is synced and it holds the Lease."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False


class LeaderRoute:
    """One address in front of several extender replicas, as a Service with a readiness probe
    is: every second it probes each replica's /readyz (only the Lease's holder is ready), and
    each new connection goes to the ready one. A connection that finds none ready is closed,
    and one whose replica dies is cut: kube-scheduler sees an error and schedules the pod
    again, as it would through a Service whose endpoint went away.
    """

    def __init__(self, port: int, replicas: list[ExtenderProcess], probe_s: float = 1.0):
        self.port = port
        self.replicas = replicas
        self.probe_s = probe_s
        self.target: int | None = None  # the port of the replica connections go to
        self._stop = threading.Event()
        self._listener: socket.socket | None = None

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(0.5)
        self._listener = listener
        for work in (self._probe, self._accept):
            threading.Thread(target=work, name=f"route-{work.__name__}", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.close()

    def _probe(self) -> None:
        while not self._stop.is_set():
            ready = [r.port for r in self.replicas if r.leading()]
            self.target = ready[0] if ready else None
            self._stop.wait(self.probe_s)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by stop
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        target = self.target
        try:
            upstream = socket.create_connection(("127.0.0.1", target), 2) if target else None
        except OSError:
            upstream = None
        if upstream is None:
            conn.close()
            return
        upstream.settimeout(None)
        back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
        back.start()
        _pump(conn, upstream)
        back.join()
        conn.close()
        upstream.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copies bytes until either side ends, then ends both directions."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    for side in (source, sink):
        try:
            side.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


@contextmanager
def idle_nodes(
    api: client.ApiClient,
    entries: list[dict],
    labels: dict[str, str] | None = None,
    gpu_changes: Mapping[int, dict] | None = None,
) -> Iterator[list[str]]:
    """KWOK nodes for fleet ``entries``, their idle GPUs published, Ready; deleted afterwards.

    ``labels`` go on every node; ``gpu_changes`` (GPU index to Gpu fields) make every node's
    GPUs differ from the fleet's one model, e.g. a node with a T4 beside its A100s.
    """
    core = client.CoreV1Api(api)
    fleet = parse_fleet({"version": "v1", "nodes": entries}, "test")
    if gpu_changes:
        fleet = replace(fleet, nodes=tuple(_changed(n, gpu_changes) for n in fleet.nodes))
    fake_nodes.create(api, fleet)
    if labels:
        for node in fleet.nodes:
            core.patch_node(node.name, {"metadata": {"labels": labels}})
    for node in fleet.nodes:
        samples = tuple(GpuUsageSample(g.uuid, 0, 0) for g in node.inventory.gpus)
        annotations = {
            constants.ANNOTATION_GPU_INVENTORY: encode_inventory(node.inventory),
            constants.ANNOTATION_GPU_USAGE: encode_usage(GpuUsage(node.name, now_utc(), samples)),
        }
        core.patch_node(node.name, {"metadata": {"annotations": annotations}})
    names = [node.name for node in fleet.nodes]
    for n in names:
        wait_until(lambda n=n: fake_nodes._schedulable(core.read_node(n)), 60, f"{n} Ready")
    try:
        yield names
    finally:
        for n in names:
            core.delete_node(n)


def _changed(node: FleetNode, gpu_changes: Mapping[int, dict]) -> FleetNode:
    gpus = tuple(replace(g, **gpu_changes.get(g.index, {})) for g in node.inventory.gpus)
    return replace(node, inventory=replace(node.inventory, gpus=gpus))


def share_pod(name: str, mib: int, **extra) -> dict:
    return gpu_pod(
        name,
        {constants.RESOURCE_VGPU: "1", constants.RESOURCE_GPU_MEMORY: str(mib)},
        **extra,
    )


def gpu_pod(
    name: str, limits: dict, node: str | None = None, annotations: dict | None = None
) -> dict:
    spec: dict = {
        "schedulerName": constants.SCHEDULER_NAME,
        "tolerations": [KWOK_TOLERATION],
        "containers": [{"name": "engine", "image": "infergrid/engine",
                        "resources": {"limits": limits}}],
    }  # fmt: skip
    # A copy: a test that adds to one pod's selector must not change every later pod's.
    spec["nodeSelector"] = {"kubernetes.io/hostname": node} if node else dict(KWOK_NODE_SELECTOR)
    return {"metadata": {"name": name, "annotations": annotations or {}}, "spec": spec}


@contextmanager
def renewed_heartbeats(api: client.ApiClient, names: list[str]) -> Iterator[None]:
    """The idle usage of KWOK nodes renewed every few seconds, as their device plugin would
    renew it: a test that outlives the extender's 30 s staleness finds them fresh. A renewal
    that fails (the API server away) is tried again at the next beat, as a plugin's is."""
    core, stop = client.CoreV1Api(api), threading.Event()

    def beat(name: str) -> None:
        try:
            node = core.read_node(name, _request_timeout=5)
            annotations = node.metadata.annotations
            inventory = decode_inventory(annotations[constants.ANNOTATION_GPU_INVENTORY])
            samples = tuple(GpuUsageSample(g.uuid, 0, 0) for g in inventory.gpus)
            usage = encode_usage(GpuUsage(name, now_utc(), samples))
            patch = {"metadata": {"annotations": {constants.ANNOTATION_GPU_USAGE: usage}}}
            core.patch_node(name, patch, _request_timeout=5)
        except Exception:  # noqa: BLE001 - the API server is away: the next beat renews
            pass

    def run() -> None:
        while not stop.wait(5):
            for name in names:
                beat(name)

    thread = threading.Thread(target=run, name="heartbeats", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


def bound(core: client.CoreV1Api, namespace: str, names: list[str]) -> bool:
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}
    return all(n in pods and pods[n].spec.node_name for n in names)


def assigned_gpus(
    core: client.CoreV1Api, namespace: str, names: list[str] | None = None
) -> list[tuple[str, str]]:
    """(node, GPU uuid) for each GPU assigned to the namespace's pods, or to those named."""
    placed = []
    for pod in core.list_namespaced_pod(namespace).items:
        if names is None or pod.metadata.name in names:
            text = pod.metadata.annotations[constants.ANNOTATION_GPU_ASSIGNMENT]
            assignment = decode_assignment(text)
            placed += [(assignment.node, g.uuid) for c in assignment.containers for g in c.gpus]
    return placed


def scheduling_failures(core: client.CoreV1Api, namespace: str, name: str) -> list[str]:
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return [e.message for e in events.items if e.reason == "FailedScheduling"]


def audit(core: client.CoreV1Api) -> dict[str, int]:
    """Checks every assignment in the cluster against its node's GPUs; returns pods per node.

    No GPU holds more memory or SMs in shares than it has, or more whole-GPU holders
    than its node's time slices (one without time-slicing), none is both held whole
    and shared, a pod bound to a node was assigned on that node, and no MIG
    instance is given twice.
    """
    gpus, slices, nodes = {}, {}, set()
    for node in core.list_node().items:
        text = (node.metadata.annotations or {}).get(constants.ANNOTATION_GPU_INVENTORY)
        if text:
            inventory = decode_inventory(text)
            gpus.update({g.uuid: g for g in inventory.gpus})
            slices.update({g.uuid: inventory.time_slices for g in inventory.gpus})
            nodes.add(node.metadata.name)
    memory, cores, holders = defaultdict(int), defaultdict(int), defaultdict(list)
    migs: list[str] = []
    per_node: dict[str, int] = defaultdict(int)
    for pod in core.list_pod_for_all_namespaces().items:
        text = (pod.metadata.annotations or {}).get(constants.ANNOTATION_GPU_ASSIGNMENT)
        if not text:
            continue
        assignment = decode_assignment(text)
        if assignment.node not in nodes:
            continue  # a node a test removed; its leftover pods hold nothing real
        if pod.spec.node_name:
            assert pod.spec.node_name == assignment.node, pod.metadata.name
        per_node[assignment.node] += 1
        for c in assignment.containers:
            if c.mig:
                migs.append(c.mig.uuid)
            for g in c.gpus:
                memory[g.uuid] += g.memory_mib if c.shared else 0
                cores[g.uuid] += g.cores if c.shared else 0
                holders[g.uuid].append(c.kind)
    for uuid, kinds in holders.items():
        assert memory[uuid] <= gpus[uuid].memory_mib, f"{uuid}: {memory[uuid]} MiB in shares"
        assert cores[uuid] <= 100, f"{uuid}: {cores[uuid]}% of SMs in shares"
        wholes = kinds.count("whole")
        assert wholes in (0, len(kinds)), f"{uuid} shared and whole: {kinds}"
        assert wholes <= slices[uuid], f"{uuid}: {wholes} holders, {slices[uuid]} time slices"
    assert len(migs) == len(set(migs)), "a MIG instance given twice"
    return dict(per_node)


def orphans(core: client.CoreV1Api, namespace: str) -> list[str]:
    """Assignments that hold GPUs for no running work: on a pod bound to another node than the
    one it names, or on a pod not bound at all. Asked once every pod should be bound, the
    list must be empty; each entry names the pod and what is wrong."""
    found = []
    for pod in core.list_namespaced_pod(namespace).items:
        text = (pod.metadata.annotations or {}).get(constants.ANNOTATION_GPU_ASSIGNMENT)
        if not text:
            continue
        named = decode_assignment(text).node
        if pod.spec.node_name != named:
            where = pod.spec.node_name or "no node"
            found.append(f"{pod.metadata.name}: assigned on {named}, bound to {where}")
    return found


def now_utc() -> datetime:
    return datetime.now(UTC)
