"""Faults under load where GPUs are given out: the extender's leader SIGKILLed in the middle of
a burst (and what such a kill leaves when it lands between bind's two writes), and the device
plugin SIGKILLed under a stream of Allocate calls, its allocation marks wiped, and started
again.

Each test tallies what it started (e2e/fault_report.py): every pod of the burst, every
Allocate call. Nothing may be lost, no GPU given twice, and no assignment left naming a node
its pod is not on.
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

import grpc
import pytest
import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from device_plugin.fake_kubelet import FakeKubelet
from device_plugin.fake_pod_resources import FakePodResources
from device_plugin.kubelet import api_pb2
from e2e.cluster import fake_nodes
from e2e.cluster.fake_nodes import KWOK_TOLERATION
from e2e.cluster.local_cluster import LocalCluster
from e2e.cluster.processes import wait_until
from e2e.extender_support import (
    ExtenderProcess,
    LeaderRoute,
    audit,
    bound,
    gpu_pod,
    idle_nodes,
    orphans,
    renewed_heartbeats,
    scheduling_failures,
)
from e2e.fault_report import Tally, load_scale, publish
from e2e.operator_support import POOL_LABEL, free_port
from e2e.plugin_process import plugin_process, spawn_plugin
from infergrid import constants
from infergrid.assignment_annotation import (
    AssignedGpu,
    ContainerAssignment,
    PodAssignment,
    decode_assignment,
    encode_assignment,
)
from infergrid.fleet import load_fleet
from infergrid.inventory import decode_inventory

pytestmark = pytest.mark.e2e

# The extender killed mid-burst.

BURST_PODS = 40  # per unit of load_scale()
BURST_NODES = 6  # of 4 GPUs each: room for the burst however its shares spread
A10 = {"model": "NVIDIA A10", "count": 4, "memoryMiB": 24576, "smCount": 72,
       "computeCapability": "8.6"}  # fmt: skip


@pytest.fixture()
def burst_pool(cluster):
    """(pool label value, node names): KWOK nodes of idle GPUs only this test's pods may use."""
    suffix = uuid.uuid4().hex[:6]
    entries = [{"name": f"burst{i}-{suffix}", "gpus": A10}
               for i in range(BURST_NODES * load_scale())]  # fmt: skip
    with idle_nodes(cluster.api, entries, labels={POOL_LABEL: suffix}) as names:
        with renewed_heartbeats(cluster.api, names):  # the burst may outlive 30 s
            yield suffix, names


@pytest.fixture()
def two_extenders(cluster, identities, tmp_path):
    """(leader, standby): two extender replicas, each with the chart's extender identity and
    a holder name of its own on the chart's extender Lease, behind the one address the local
    infergrid-scheduler calls (LeaderRoute: each connection goes to the replica whose
    /readyz, leader-only, answers)."""
    if not cluster.local:
        pytest.skip("needs the local cluster's infergrid-scheduler pointed at these extenders")
    kubeconfig = identities.kubeconfig("extender", tmp_path / "extender.kubeconfig")
    lease = identities.lease_args()

    def replica(name: str, standby: bool) -> ExtenderProcess:
        url = f"http://127.0.0.1:{free_port()}/"
        return ExtenderProcess(url, kubeconfig, tmp_path / f"extender-{name}.log", lease,
                               identity=f"e2e-extender-{name}", standby=standby)  # fmt: skip

    leader, standby = replica("a", standby=False), replica("b", standby=True)
    route = LeaderRoute(urlparse(LocalCluster().extender_url()).port, [leader, standby])
    with ExitStack() as stack:
        for part in (leader, standby, route):  # stopped in the reverse order
            stack.callback(part.stop)
            part.start()  # the leader's returns once it leads
        wait_until(lambda: route.target == leader.port, 10, "the route to the leader")
        yield leader, standby


@dataclass
class PodHistory:
    """Every node each pod was seen bound to, and every placement its assignment named once it
    was bound, from a watch of the namespace: a pod bound once shows one of each."""

    nodes: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    placements: dict[str, set[tuple]] = field(default_factory=lambda: defaultdict(set))

    def record(self, pod: client.V1Pod) -> None:
        name, node = pod.metadata.name, pod.spec.node_name
        if not node:
            return
        self.nodes[name].add(node)
        text = (pod.metadata.annotations or {}).get(constants.ANNOTATION_GPU_ASSIGNMENT)
        self.placements[name].add(placement(text))

    def bound_more_than_once(self) -> dict[str, str]:
        twice = {n: f"nodes {sorted(s)}" for n, s in self.nodes.items() if len(s) > 1}
        moved = {n: f"placements {sorted(map(str, p))}" for n, p in self.placements.items()
                 if len(p) > 1}  # fmt: skip
        return {**moved, **twice}


def placement(text: str | None) -> tuple:
    """What an assignment gives out (node, then each container's GPUs or MIG instance), without
    the device plugin's allocated marks, which change it after the bind."""
    if text is None:
        return ("none",)
    a = decode_assignment(text)
    return (a.node, *((c.name, tuple(g.uuid for g in c.gpus), c.mig and c.mig.uuid)
                      for c in a.containers))  # fmt: skip


def follow(core: client.CoreV1Api, namespace: str, history: PodHistory, done: threading.Event):
    """Records every pod change in the namespace until `done`, in a thread."""

    def run() -> None:
        version = None
        while not done.is_set():
            stream = watch.Watch()
            try:
                events = stream.stream(
                    core.list_namespaced_pod, namespace, resource_version=version,
                    timeout_seconds=5,
                )  # fmt: skip
                for event in events:
                    history.record(event["object"])
                    version = event["object"].metadata.resource_version
                    if done.is_set():
                        stream.stop()
            except ApiException as err:
                if err.status != 410:
                    raise
                version = None  # too old: list again

    thread = threading.Thread(target=run, name="pod-history", daemon=True)
    thread.start()
    return thread


def burst_pod(index: int, pool: str) -> dict:
    """Every fifth pod a whole GPU, the others a 4 GiB share; only on the pool's nodes."""
    limits = (
        {constants.RESOURCE_GPU: "1"}
        if index % 5 == 0
        else {constants.RESOURCE_VGPU: "1", constants.RESOURCE_GPU_MEMORY: "4096"}
    )
    pod = gpu_pod(f"burst-{index:03d}", limits)
    pod["spec"]["nodeSelector"] = {**pod["spec"]["nodeSelector"], POOL_LABEL: pool}
    return pod


def bound_names(core: client.CoreV1Api, namespace: str) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(namespace).items if p.spec.node_name}


def test_the_standby_extender_takes_over_a_burst_when_the_leader_is_killed(
    cluster, namespace, burst_pool, two_extenders
):
    """kube-scheduler keeps calling one address; the Lease moves to the standby one lease
    duration after the leader's last renewal, and the pods whose calls the kill cut off are
    scheduled again. Each pod is bound once, on the GPUs its assignment names."""
    core = client.CoreV1Api(cluster.api)
    leader, standby = two_extenders
    pool, nodes = burst_pool
    count = BURST_PODS * load_scale()
    tally = Tally("extender killed mid-burst",
                  f"{count} GPU pods (1 in 5 a whole GPU) on {len(nodes)} KWOK nodes")  # fmt: skip
    history, done = PodHistory(), threading.Event()
    watcher = follow(core, namespace, history, done)
    names = [f"burst-{i:03d}" for i in range(count)]
    creator = threading.Thread(
        target=lambda: [
            core.create_namespaced_pod(namespace, burst_pod(i, pool)) for i in range(count)
        ]  # fmt: skip
    )
    creator.start()
    wait_until(lambda: len(bound_names(core, namespace)) >= count // 4, 120, "a quarter bound")
    at_kill = len(bound_names(core, namespace))
    assert at_kill < count, "the burst was over before the kill"
    leader.kill()
    killed = time.monotonic()
    wait_until(standby.leading, 60, "the standby leading")
    tally.recovery_s = round(time.monotonic() - killed, 1)
    creator.join()
    try:
        wait_until(lambda: bound_names(core, namespace) >= set(names), 240, "every pod bound")
    finally:
        done.set()
        watcher.join(10)
        bound = bound_names(core, namespace)
        retried = [n for n in names if scheduling_failures(core, namespace, n)]
        for n in names:
            tally.count("answered" if n in bound else "lost")
        tally.seen = (
            f"{at_kill} bound when the leader was killed; the standby led "
            f"{tally.recovery_s} s later; {len(retried)} pods scheduled again after a "
            f"FailedScheduling; {len(bound)} of {count} bound"
        )
        publish(tally)
    assert tally.outcomes["lost"] == 0
    for n in names:
        history.record(core.read_namespaced_pod(n, namespace))  # the last state, if unseen
    assert history.bound_more_than_once() == {}
    assert orphans(core, namespace) == []
    audit(core)


HOLD_GATE = "infergrid.io/e2e-hold"


@pytest.fixture()
def lone_gpu(cluster):
    """(pool label value, node name): a KWOK node of one idle 24 GiB GPU, for this test only."""
    suffix = uuid.uuid4().hex[:6]
    entries = [{"name": f"lone-{suffix}", "gpus": {**A10, "count": 1}}]
    with idle_nodes(cluster.api, entries, labels={POOL_LABEL: suffix}) as (name,):
        yield suffix, name


@pytest.mark.unpoliced("an earlier release's extender wrote the assignment with a patch")
def test_a_pod_left_assigned_but_unbound_by_a_killed_leader_is_bound_where_it_holds(
    cluster, namespace, lone_gpu, two_extenders
):
    """What a leader of an earlier release (which wrote the assignment, then the Binding)
    leaves when killed between the two writes, upgraded meanwhile to one that binds in one
    call: the pod's assignment recorded, no Binding. The pod asks for 16 GiB of a 24 GiB GPU
    its own assignment already holds; counted against itself it would wait forever ("8192
    MiB free, needs 16384")."""
    core = client.CoreV1Api(cluster.api)
    pool, node = lone_gpu
    gpu = decode_inventory(core.read_node(node).metadata.annotations[
        constants.ANNOTATION_GPU_INVENTORY]).gpus[0].uuid  # fmt: skip
    pod = gpu_pod("left", {constants.RESOURCE_VGPU: "1", constants.RESOURCE_GPU_MEMORY: "16384"})
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node, POOL_LABEL: pool}
    pod["spec"]["schedulingGates"] = [{"name": HOLD_GATE}]
    core.create_namespaced_pod(namespace, pod)
    share = ContainerAssignment("engine", (AssignedGpu(gpu, 16384, 0),), shared=True)
    written = encode_assignment(PodAssignment(node, datetime.now(UTC), (share,)))
    body = {"metadata": {"annotations": {constants.ANNOTATION_GPU_ASSIGNMENT: written}}}
    core.patch_namespaced_pod("left", namespace, body)  # as the old leader wrote it
    core.patch_namespaced_pod("left", namespace, {"spec": {"schedulingGates": None}})
    wait_until(lambda: bound(core, namespace, ["left"]), 60, "the pod bound",
               lambda: _not_refused_for_itself(core, namespace))  # fmt: skip
    live = core.read_namespaced_pod("left", namespace)
    assert live.spec.node_name == node
    assert live.metadata.annotations[constants.ANNOTATION_GPU_ASSIGNMENT] == written
    assert orphans(core, namespace) == []
    audit(core)


def _not_refused_for_itself(core: client.CoreV1Api, namespace: str) -> None:
    """Fails at once when the scheduler refused the pod for the room it holds itself."""
    refused = [m for m in scheduling_failures(core, namespace, "left") if "needs 16384" in m]
    if refused:
        raise AssertionError(f"refused for its own room: {refused[0]}")


# The device plugin restarted under Allocate load, with its marks lost.

PLUGIN_GPUS = 4  # per unit of load_scale(), each taking SHARES_PER_GPU shares
SHARES_PER_GPU = 4
SHARE_MIB = 5120  # four fill an L4's 23034 MiB; a fifth does not fit
RETRY_S = 60  # the longest one pod's admission is retried
L4 = {"model": "NVIDIA L4", "memoryMiB": 23034, "smCount": 58, "computeCapability": "8.9"}


@pytest.fixture()
def allocate_node(cluster, identities, tmp_path):
    """(node, fleet file, the plugin's kubeconfig): a KWOK node of L4s for the plugin alone,
    its token bound to the suite release's DaemonSet pod there."""
    if not cluster.local:
        pytest.skip("runs the device plugin for a node it creates on the local cluster")
    node = f"alloc-{uuid.uuid4().hex[:6]}"
    fleet = tmp_path / "fleet.yaml"
    gpus = {**L4, "count": PLUGIN_GPUS * load_scale()}
    fleet.write_text(yaml.safe_dump({"version": "v1", "nodes": [{"name": node, "gpus": gpus}]}))
    fake_nodes.create(cluster.api, load_fleet(fleet))
    try:
        yield node, fleet, identities.plugin_kubeconfig(node, tmp_path / "plugin.kubeconfig")
    finally:
        client.CoreV1Api(cluster.api).delete_node(node)


def share_on(name: str, node: str, gpu: str) -> dict:
    """A pod bound to `node` whose assignment (as the extender writes it) is a share of `gpu`."""
    share = ContainerAssignment("engine", (AssignedGpu(gpu, SHARE_MIB, 25),), shared=True)
    assignment = PodAssignment(node, datetime.now(UTC), (share,))
    limits = {constants.RESOURCE_VGPU: "1", constants.RESOURCE_GPU_MEMORY: str(SHARE_MIB),
              constants.RESOURCE_GPU_CORES: "25"}  # fmt: skip
    return {
        "metadata": {"name": name,
                     "annotations": {constants.ANNOTATION_GPU_ASSIGNMENT:
                                     encode_assignment(assignment)}},
        "spec": {"schedulerName": constants.SCHEDULER_NAME, "nodeName": node,
                 "tolerations": [KWOK_TOLERATION],
                 "containers": [{"name": "engine", "image": "infergrid/engine",
                                 "resources": {"limits": limits}}]},
    }  # fmt: skip


@dataclass
class Kubelet:
    """What the kubelet does around Allocate: picks a free share slot of the GPU, calls the
    plugin at its latest registration, and once granted records the container as holding the
    slot (what PodResources then shows)."""

    kubelet: FakeKubelet
    held: FakePodResources
    namespace: str
    granted: dict[str, tuple[str, int]] = field(default_factory=dict)  # pod -> (slot, MiB)
    errors: Counter[str] = field(default_factory=Counter)  # gRPC status code -> calls

    def admit(self, pod: str, gpu: str) -> grpc.RpcError | None:
        """One Allocate call for the pod's container; None when granted, else the error."""
        taken = {slot for slot, _ in self.granted.values()}
        slot = next(f"{gpu}::vgpu-{k}" for k in range(64) if f"{gpu}::vgpu-{k}" not in taken)
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[slot])]
        )
        try:
            reply = self.kubelet.plugin(constants.RESOURCE_VGPU).Allocate(request, timeout=10)
        except grpc.RpcError as err:
            self.errors[err.code().name] += 1
            return err
        envs = reply.container_responses[0].envs
        self.granted[pod] = (slot, int(envs["INFERGRID_GPU_MEMORY_MIB"]))
        self.held.hold(self.namespace, pod, "engine", constants.RESOURCE_VGPU, slot)
        return None


@dataclass
class PluginRestart:
    """SIGKILLs the plugin, wipes its marks, and starts it again, in a thread, while the
    Allocate stream goes on; `killed` and `back` are when it died and when it registered."""

    proc: subprocess.Popen
    start: Callable[[], subprocess.Popen]
    kubelet: FakeKubelet
    forget: Callable[[], None]
    killed: float | None = None
    back: threading.Event = field(default_factory=threading.Event)

    def run(self) -> threading.Thread:
        thread = threading.Thread(target=self._restart, name="plugin-restart", daemon=True)
        thread.start()
        return thread

    def _restart(self) -> None:
        since = len(self.kubelet.registrations)
        self.proc.kill()
        self.proc.wait(10)
        self.killed = time.monotonic()
        self.forget()
        self.proc = self.start()
        if self.kubelet.wait_registered({constants.RESOURCE_VGPU}, since, 30):
            self.back.set()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def outcome(error: grpc.RpcError | None, started: float, killed: float | None) -> str:
    """An Allocate call by how it ended: granted; cut off by the kill while it ran; refused
    with a status (the plugin down, or saying no); or no answer in time."""
    if error is None:
        return "answered"
    if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "lost"
    if error.code() == grpc.StatusCode.UNAVAILABLE and killed is not None and started < killed:
        return "failed_in_flight"
    return "refused"


def forget_marks(core: client.CoreV1Api, namespace: str) -> None:
    """Wipes the plugin's allocated marks from every assignment in the namespace."""
    for pod in core.list_namespaced_pod(namespace).items:
        text = (pod.metadata.annotations or {}).get(constants.ANNOTATION_GPU_ASSIGNMENT)
        if not text:
            continue
        a = decode_assignment(text)
        unmarked = replace(a, containers=tuple(replace(c, allocated=False) for c in a.containers))
        annotations = {constants.ANNOTATION_GPU_ASSIGNMENT: encode_assignment(unmarked)}
        core.patch_namespaced_pod(pod.metadata.name, namespace,
                                  {"metadata": {"annotations": annotations}})  # fmt: skip


@pytest.mark.unpoliced("the test writes assignments directly, as the extender would")
def test_a_plugin_restarted_under_allocate_load_without_its_marks_gives_nothing_twice(
    cluster, namespace, allocate_node, tmp_path
):
    """The plugin's record of what it granted is its ledger, in memory, and the marks it
    writes into the assignments. Killed, and the marks wiped, it learns who holds what from
    the kubelet's PodResources again: a fifth share of a GPU its first four fill is then
    refused, where a plugin that forgot them would grant it."""
    node, fleet, kubeconfig = allocate_node
    core = client.CoreV1Api(cluster.api)
    gpus = [g.uuid for g in load_fleet(fleet).nodes[0].inventory.gpus]
    pods = [(f"share-{g}-{k}", gpu) for g, gpu in enumerate(gpus) for k in range(SHARES_PER_GPU)]
    for name, gpu in [*pods, ("fifth", gpus[0])]:
        core.create_namespaced_pod(namespace, share_on(name, node, gpu))
    held = FakePodResources(Path(tempfile.mkdtemp(prefix="pr-", dir="/tmp")) / "kubelet.sock")
    held.start()
    args = ("--pod-resources-socket", str(held.socket), "--usage-interval", "1")
    log = tmp_path / "plugin.log"
    load = f"{len(pods)} pods' Allocate calls, 0.2 s apart, on {len(gpus)} GPUs"
    tally = Tally("device plugin restarted with its marks lost", load)
    recovered = None
    try:
        with plugin_process(kubeconfig, fleet, node, log, *args) as (kubelet, proc):
            kube = Kubelet(kubelet, held, namespace)
            restart = PluginRestart(
                proc, lambda: spawn_plugin(kubeconfig, fleet, node, kubelet.plugin_dir, log, *args),
                kubelet, lambda: forget_marks(core, namespace))  # fmt: skip
            restarter = None
            try:
                for name, gpu in pods:
                    error = admitted(kube, name, gpu, tally, restart)
                    if error is None and restart.back.is_set() and recovered is None:
                        recovered = time.monotonic() - restart.killed
                    if restarter is None and len(kube.granted) == len(pods) // 2:
                        restarter = restart.run()
                    time.sleep(0.2)
                restarter.join(60)
                in_stream = dict(kube.errors)
                fifth = kube.admit("fifth", gpus[0])
            finally:
                restart.stop()
    finally:
        held.stop()
    tally.recovery_s = None if recovered is None else round(recovered, 1)
    refusals = ", ".join(f"{n} {code}" for code, n in sorted(in_stream.items()))
    tally.seen = (f"killed after {len(pods) // 2} grants, marks wiped; calls refused with a "
                  f"status: {refusals or 'none'}; every pod granted once; the ledger rebuilt "
                  "from PodResources: a fifth share of a full GPU refused")  # fmt: skip
    publish(tally)
    assert tally.outcomes["lost"] == 0
    assert fifth is not None and fifth.code() == grpc.StatusCode.FAILED_PRECONDITION, fifth
    assert "does not fit beside the containers already granted" in fifth.details()
    assert sorted(kube.granted) == sorted(name for name, _ in pods)
    slots = [slot for slot, _ in kube.granted.values()]
    assert len(slots) == len(set(slots)), slots
    per_gpu: dict[str, int] = defaultdict(int)
    for slot, mib in kube.granted.values():
        per_gpu[slot.split("::")[0]] += mib
    assert max(per_gpu.values()) <= L4["memoryMiB"], per_gpu
    assert "seeded from allocation marks" not in log.read_text()


def admitted(
    kube: Kubelet, name: str, gpu: str, tally: Tally, restart: PluginRestart
) -> grpc.RpcError | None:
    """Asks until the pod's container is granted, as the kubelet retries a pod whose admission
    failed, counting every call; gives up at a call that got no answer in time, or after
    RETRY_S of refusals (the test then fails on the pod never granted)."""
    deadline = time.monotonic() + RETRY_S
    while True:
        started = time.monotonic()
        error = kube.admit(name, gpu)
        tally.count(outcome(error, started, restart.killed))
        if error is None or error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return error
        if started > deadline:
            return error
        time.sleep(0.2)
