"""A GPU's MPS control daemon is part of its health: one that is missing, dead, stuck or was
restarted makes the GPU unhealthy through the tracker, as an ECC fault does, so the kubelet is
no longer offered the GPU and the pods on it are told. Fake daemons, real processes."""

from __future__ import annotations

import signal
import threading

from prometheus_client import REGISTRY

from device_plugin.health import HealthTracker
from device_plugin.kubelet import HEALTHY, UNHEALTHY, api_pb2
from device_plugin.mps_health import MpsWatch
from device_plugin.visibility import MOUNT_DIR
from infergrid.constants import RESOURCE_GPU, RESOURCE_VGPU
from infergrid.share_edits import gpu_paths
from tests.device_plugin.conftest import pod, share, whole
from tests.device_plugin.test_kubelet_protocol import L4_0, allocate
from tests.device_plugin.test_pod_health import FakeClock, FakeConditions
from tests.placement.builders import gpu

GPUS = [gpu(0), gpu(1)]
A, B = (g.uuid for g in GPUS)


def watch(daemons, tracker: HealthTracker, timeout_s: float = 5.0) -> MpsWatch:
    return MpsWatch(
        daemons.control, daemons.root, lambda: GPUS, tracker, threading.Event(), timeout_s=timeout_s
    )


def up(uuid: str) -> float | None:
    return REGISTRY.get_sample_value("infergrid_device_plugin_mps_daemon_up", {"gpu": uuid})


def test_daemons_that_answer_leave_their_gpus_healthy(mps_daemons):
    mps_daemons.start(A, B)
    tracker = HealthTracker(30)
    watch(mps_daemons, tracker).wait_ready(10)
    assert tracker.unhealthy() == {} and tracker.version == 0
    assert (up(A), up(B)) == (1.0, 1.0)


def test_a_gpu_whose_daemon_never_came_is_unhealthy_once_the_wait_is_over(mps_daemons):
    mps_daemons.start(A)
    tracker = HealthTracker(30)
    watch(mps_daemons, tracker).wait_ready(0.5)
    socket = gpu_paths(mps_daemons.root, B).control_socket
    assert tracker.unhealthy() == {B: f"no MPS control daemon: {socket} does not exist"}
    assert up(B) == 0.0


def test_a_dead_daemon_makes_its_gpu_unhealthy(mps_daemons):
    mps_daemons.start(A, B)
    tracker = HealthTracker(30)
    probe = watch(mps_daemons, tracker)
    probe.check_once()
    mps_daemons.kill(B)
    probe.check_once()
    assert tracker.unhealthy() == {
        B: "its MPS control daemon does not answer: 'get_server_list' failed (exit 1): "
        "Cannot find MPS control daemon process"
    }


def test_a_stuck_daemon_makes_its_gpu_unhealthy_within_one_timeout(mps_daemons):
    mps_daemons.start(A, B)
    tracker = HealthTracker(30)
    probe = watch(mps_daemons, tracker, timeout_s=0.5)
    mps_daemons.kill(A, signal.SIGSTOP)
    mps_daemons.kill(B, signal.SIGSTOP)
    probe.check_once()
    reason = "its MPS control daemon does not answer: 'get_server_list': no answer within 0.5 s"
    assert tracker.unhealthy() == {A: reason, B: reason}


def test_a_daemon_restarted_between_two_rounds_is_a_fault_that_passes(mps_daemons):
    """Its clients lost their server, so the pods on the GPU must move; then it is fine."""
    mps_daemons.start(A, B)
    clock = FakeClock()
    tracker = HealthTracker(30, clock=clock)
    probe = watch(mps_daemons, tracker)
    probe.check_once()
    first = mps_daemons.pid(A)
    mps_daemons.kill(A)
    mps_daemons.start(A)
    restarts = REGISTRY.get_sample_value(
        "infergrid_device_plugin_mps_daemon_restarts_total", {"gpu": A}
    )
    probe.check_once()
    assert tracker.unhealthy() == {
        A: f"its MPS control daemon restarted (pid {first}, now {mps_daemons.pid(A)}), "
        "so its clients lost their server"
    }
    assert (
        REGISTRY.get_sample_value("infergrid_device_plugin_mps_daemon_restarts_total", {"gpu": A})
        == (restarts or 0) + 1
    )
    probe.check_once()
    clock.now += 30
    assert tracker.unhealthy() == {} and up(A) == 1.0


def test_through_grpc_a_share_on_an_mps_gpu_gets_its_daemon_and_limits(start_plugin, mps_daemons):
    mps_daemons.start(*L4_0)
    p = start_plugin("l4-0", **mps_daemons.settings)
    p.kubelet.wait_registered({RESOURCE_VGPU})
    target = p.gpu(3).uuid
    p.pods.items = [pod("llm", "l4-0", share("engine", target, 8192, cores=30))]
    reply = allocate(p.kubelet.plugin(RESOURCE_VGPU), [f"{target}::vgpu-4"])
    response = reply.container_responses[0]
    pipe = str(gpu_paths(mps_daemons.root, target).pipe)
    assert dict(response.envs) == {
        "NVIDIA_VISIBLE_DEVICES": MOUNT_DIR,
        "INFERGRID_GPU_MEMORY_MIB": "8192",
        "CUDA_MPS_PIPE_DIRECTORY": pipe,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
    }
    assert [(m.container_path, m.host_path, m.read_only) for m in response.mounts] == [
        (f"{MOUNT_DIR}/{target}", "/dev/null", True),
        (pipe, pipe, False),
        ("/dev/shm", str(mps_daemons.root / "shm"), False),
    ]


def test_through_grpc_a_dead_daemon_withdraws_its_gpu_and_its_pods_are_told(
    start_plugin, mps_daemons
):
    mps_daemons.start(*L4_0)
    conditions = FakeConditions()
    p = start_plugin(
        "l4-0", usage_interval_s=0.1, pod_conditions=conditions, **mps_daemons.settings
    )
    conditions.add(pod("on-2", "l4-0", share("c", p.gpu(2).uuid, 4096)))
    conditions.add(pod("on-1", "l4-0", whole("c", p.gpu(1).uuid)))
    p.kubelet.wait_registered({RESOURCE_GPU, RESOURCE_VGPU})
    slots = p.kubelet.plugin(RESOURCE_VGPU).ListAndWatch(api_pb2.Empty(), timeout=20)
    assert all(d.health == HEALTHY for d in next(slots).devices)
    mps_daemons.kill(p.gpu(2).uuid)
    withdrawn = {d.ID.split("::")[0] for d in next(slots).devices if d.health == UNHEALTHY}
    slots.cancel()
    assert withdrawn == {p.gpu(2).uuid}
    assert conditions.changed.wait(10)
    (told,) = conditions.written
    assert (told.pod.name, told.condition.status, told.warns) == ("on-2", "False", True)
    assert told.condition.message.startswith(
        f"GPU {p.gpu(2).uuid} (index 2) is unhealthy: its MPS control daemon does not answer"
    )
