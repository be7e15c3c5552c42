"""The plugin speaks the kubelet device plugin protocol over real unix-socket gRPC."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from device_plugin.kube import API_TIMEOUT_S, KubePods
from device_plugin.kubelet import API_VERSION, HEALTHY, UNHEALTHY, api_pb2
from device_plugin.visibility import MOUNT_DIR
from infergrid.constants import RESOURCE_GPU, RESOURCE_VGPU, SCHEDULER_NAME
from infergrid.fleet import load_fleet
from tests.device_plugin.conftest import SAMPLE, mig, pod, share, whole
from tests.device_plugin.test_kube import FakeCore, timed_out
from tests.device_plugin.test_pod_health import FakeConditions

L4_0 = [g.uuid for n in load_fleet(SAMPLE).nodes if n.name == "l4-0" for g in n.inventory.gpus]


def allocate(stub, *device_lists):
    request = api_pb2.AllocateRequest(
        container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in device_lists
        ]
    )
    return stub.Allocate(request, timeout=5)


def mounted(response: api_pb2.ContainerAllocateResponse) -> list[str]:
    """The GPUs a container is shown by volume mounts, as the NVIDIA runtime reads them."""
    assert all(m.host_path == "/dev/null" and m.read_only for m in response.mounts)
    assert all(m.container_path.startswith(f"{MOUNT_DIR}/") for m in response.mounts)
    return [m.container_path.removeprefix(f"{MOUNT_DIR}/") for m in response.mounts]


def first_list(stub) -> list[api_pb2.Device]:
    stream = stub.ListAndWatch(api_pb2.Empty(), timeout=10)
    devices = list(next(stream).devices)
    stream.cancel()
    return devices


def test_registers_each_resource_on_its_own_socket(start_plugin):
    p = start_plugin("a100-1")
    wanted = {RESOURCE_GPU, RESOURCE_VGPU, "nvidia.com/mig-3g.40gb"}
    assert p.kubelet.wait_registered(wanted)
    requests = {r.resource_name: r for r in p.kubelet.registrations}
    assert all(r.version == API_VERSION for r in requests.values())
    assert len({r.endpoint for r in requests.values()}) == 3
    assert all((p.kubelet.plugin_dir / r.endpoint).exists() for r in requests.values())
    assert requests[RESOURCE_GPU].options.get_preferred_allocation_available


def test_list_and_watch_advertises_whole_gpus_share_slots_and_mig(start_plugin):
    p = start_plugin("a100-1")
    p.kubelet.wait_registered({RESOURCE_GPU, RESOURCE_VGPU, "nvidia.com/mig-3g.40gb"})
    whole_ids = [d.ID for d in first_list(p.kubelet.plugin(RESOURCE_GPU))]
    assert len(whole_ids) == 7  # GPU 0 is in MIG mode
    slots = first_list(p.kubelet.plugin(RESOURCE_VGPU))
    assert len(slots) == 70 and all(d.health == HEALTHY for d in slots)
    migs = first_list(p.kubelet.plugin("nvidia.com/mig-3g.40gb"))
    assert [d.ID for d in migs] == [m.uuid for m in p.gpu(0).mig_instances]
    assert {d.topology.nodes[0].ID for d in slots} == {0, 1}


def test_time_slicing_advertises_replicas_per_gpu(start_plugin):
    p = start_plugin("l4-0", gpu_replicas=4)
    p.kubelet.wait_registered({RESOURCE_GPU})
    ids = [d.ID for d in first_list(p.kubelet.plugin(RESOURCE_GPU))]
    assert len(ids) == 16 and ids[1] == f"{p.gpu(0).uuid}::1"


def test_mig_strategy_single_advertises_instances_as_gpus(start_plugin):
    p = start_plugin("a100-1", mig_strategy="single")
    p.kubelet.wait_registered({RESOURCE_GPU})
    ids = {d.ID for d in first_list(p.kubelet.plugin(RESOURCE_GPU))}
    assert {m.uuid for m in p.gpu(0).mig_instances} <= ids
    assert not any(r.resource_name.startswith("nvidia.com/mig-") for r in p.kubelet.registrations)


def test_a_health_flip_is_streamed_and_recovers_after_the_quiet_period(start_plugin):
    p = start_plugin("l4-0", health_quiet_period_s=1.0)
    p.kubelet.wait_registered({RESOURCE_GPU})
    stream = p.kubelet.plugin(RESOURCE_GPU).ListAndWatch(api_pb2.Empty(), timeout=20)
    assert all(d.health == HEALTHY for d in next(stream).devices)
    uuid = p.gpu(2).uuid
    p.nvml.inject_xid(2, 32)  # a transient fault: in neither XID list
    flipped = next(stream).devices
    assert [d.ID for d in flipped if d.health == UNHEALTHY] == [uuid]
    recovered = next(stream).devices
    assert all(d.health == HEALTHY for d in recovered)
    stream.cancel()


def test_a_gpu_that_needs_a_reset_stays_unhealthy_past_the_quiet_period(start_plugin):
    p = start_plugin("l4-0", health_quiet_period_s=0.2)
    p.kubelet.wait_registered({RESOURCE_GPU})
    stream = p.kubelet.plugin(RESOURCE_GPU).ListAndWatch(api_pb2.Empty(), timeout=20)
    next(stream)
    p.nvml.inject_xid(2, 48)  # double-bit ECC error
    assert [d.ID for d in next(stream).devices if d.health == UNHEALTHY] == [p.gpu(2).uuid]
    time.sleep(1.0)
    assert not p.runtime.tracker.is_healthy(p.gpu(2).uuid)
    stream.cancel()


def test_an_ecc_fault_is_streamed_and_the_pods_on_the_gpu_are_told(start_plugin):
    conditions = FakeConditions()
    p = start_plugin("l4-0", usage_interval_s=0.1, pod_conditions=conditions)
    conditions.add(pod("on-2", "l4-0", share("c", p.gpu(2).uuid, 4096)))
    conditions.add(pod("on-1", "l4-0", whole("c", p.gpu(1).uuid)))
    p.kubelet.wait_registered({RESOURCE_GPU})
    stream = p.kubelet.plugin(RESOURCE_GPU).ListAndWatch(api_pb2.Empty(), timeout=20)
    next(stream)
    p.nvml.inject_ecc(2, remap_pending=True)
    assert [d.ID for d in next(stream).devices if d.health == UNHEALTHY] == [p.gpu(2).uuid]
    stream.cancel()
    assert conditions.changed.wait(10)
    (told,) = conditions.written
    assert (told.pod.name, told.condition.status, told.warns) == ("on-2", "False", True)
    reason = "ECC remapPending is true (a row waits to be remapped at the next reset)"
    assert told.condition.message == (
        f"GPU {p.gpu(2).uuid} (index 2) is unhealthy: {reason}: needs a GPU reset"
    )


def test_nvml_errors_mark_the_gpu_unhealthy_without_crashing(start_plugin):
    p = start_plugin("l4-0", health_quiet_period_s=30.0)
    p.kubelet.wait_registered({RESOURCE_GPU})
    stream = p.kubelet.plugin(RESOURCE_GPU).ListAndWatch(api_pb2.Empty(), timeout=20)
    next(stream)
    p.nvml.fail("memory_used_mib", 1)
    devices = next(stream).devices
    assert [d.ID for d in devices if d.health == UNHEALTHY] == [p.gpu(1).uuid]
    stream.cancel()
    assert p.runtime.plugins.registered.is_set()


def test_re_registers_after_a_kubelet_restart(start_plugin):
    p = start_plugin("l4-0")
    p.kubelet.wait_registered({RESOURCE_GPU, RESOURCE_VGPU})
    before = len(p.kubelet.registrations)
    p.kubelet.restart()
    assert p.kubelet.wait_registered({RESOURCE_GPU, RESOURCE_VGPU}, since=before, timeout=5)
    assert len(first_list(p.kubelet.plugin(RESOURCE_GPU))) == 4


def test_preferred_whole_gpus_are_the_nvlink_set(start_plugin, short_dir):
    fleet = short_dir / "fleet.yaml"
    fleet.write_text(
        "version: v1\nnodes:\n- name: pairs\n  gpus: {model: NVIDIA H100 80GB HBM3, count: 4,"
        " memoryMiB: 81559, smCount: 132, computeCapability: '9.0'}\n"
        "  topology: {nvlink: pairs, numaNodes: 2}\n"
    )
    p = start_plugin("pairs", fleet=fleet)
    p.kubelet.wait_registered({RESOURCE_GPU})
    ids = [p.gpu(i).uuid for i in range(4)]
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=ids[1:], allocation_size=2
            ),
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=ids, must_include_deviceIDs=[ids[1]], allocation_size=2
            ),
        ]
    )
    reply = p.kubelet.plugin(RESOURCE_GPU).GetPreferredAllocation(request, timeout=5)
    assert sorted(reply.container_responses[0].deviceIDs) == sorted(ids[2:4])
    assert sorted(reply.container_responses[1].deviceIDs) == sorted(ids[0:2])


def test_preferred_share_slot_is_on_the_assigned_gpu(start_plugin):
    p = start_plugin("l4-0")
    p.kubelet.wait_registered({RESOURCE_VGPU})
    target = p.gpu(2).uuid
    p.pods.items = [pod("llm", "l4-0", share("engine", target, 8192))]
    slots = [d.ID for d in first_list(p.kubelet.plugin(RESOURCE_VGPU))]
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=slots, allocation_size=1
            )
        ]
    )
    reply = p.kubelet.plugin(RESOURCE_VGPU).GetPreferredAllocation(request, timeout=5)
    assert reply.container_responses[0].deviceIDs[0].startswith(f"{target}::vgpu-")


def test_a_pod_of_another_scheduler_does_not_steer_the_preferred_share_slot(start_plugin):
    p = start_plugin("l4-0")
    p.kubelet.wait_registered({RESOURCE_VGPU})
    rogue, ours = p.gpu(1).uuid, p.gpu(2).uuid
    p.pods.items = [
        pod("rogue", "l4-0", share("c", rogue, 8192), scheduler="default-scheduler"),
        pod("llm", "l4-0", share("engine", ours, 8192), age_s=5),
    ]
    slots = [d.ID for d in first_list(p.kubelet.plugin(RESOURCE_VGPU))]
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=slots, allocation_size=1
            )
        ]
    )
    reply = p.kubelet.plugin(RESOURCE_VGPU).GetPreferredAllocation(request, timeout=5)
    assert reply.container_responses[0].deviceIDs[0].startswith(f"{ours}::vgpu-")


def test_allocate_whole_gpus_mounts_their_device_list_and_marks_the_container(start_plugin):
    """By default the GPUs are kubelet-made mounts: a NVIDIA_VISIBLE_DEVICES the pod sets
    itself is ignored by a runtime that accepts only mounts from unprivileged pods."""
    p = start_plugin("l4-0")
    p.kubelet.wait_registered({RESOURCE_GPU})
    a, b = p.gpu(0).uuid, p.gpu(1).uuid
    p.pods.items = [pod("train", "l4-0", whole("main", a, b))]
    reply = allocate(p.kubelet.plugin(RESOURCE_GPU), [b, a])
    response = reply.container_responses[0]
    assert mounted(response) == sorted([a, b])
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == MOUNT_DIR
    assert response.envs["INFERGRID_GPU_MEMORY_MIB"] == "23034"
    assert list(response.cdi_devices) == []
    assert [(g.pending.pod.name, g.pending.container.name) for g in p.granted] == [
        ("train", "main")
    ]


def test_allocate_a_mig_device(start_plugin):
    p = start_plugin("a100-1")
    p.kubelet.wait_registered({"nvidia.com/mig-3g.40gb"})
    instance = p.gpu(0).mig_instances[1]
    p.pods.items = [pod("mig", "a100-1", mig("main", instance.uuid, "3g.40gb", p.gpu(0).uuid))]
    reply = allocate(p.kubelet.plugin("nvidia.com/mig-3g.40gb"), [instance.uuid])
    response = reply.container_responses[0]
    assert mounted(response) == [instance.uuid]
    assert response.envs["INFERGRID_GPU_MEMORY_MIB"] == str(instance.memory_mib)


@pytest.mark.parametrize(
    ("strategy", "envs", "mounts", "cdi"),
    [
        ("volume-mounts", {"NVIDIA_VISIBLE_DEVICES": MOUNT_DIR}, ["{a}", "{b}"], []),
        ("cdi", {}, [], ["nvidia.com/gpu={a}", "nvidia.com/gpu={b}"]),
        ("envvar", {"NVIDIA_VISIBLE_DEVICES": "{a},{b}"}, [], []),
    ],
)
def test_each_device_list_strategy_shows_the_container_exactly_its_gpus(
    start_plugin, mps_daemons, strategy, envs, mounts, cdi
):
    """volume-mounts (default) and cdi do not trust the pod's env; envvar does. Whole GPUs
    get no MPS, even with it on."""
    mps_daemons.start(*L4_0)
    p = start_plugin("l4-0", device_list_strategy=strategy, **mps_daemons.settings)
    p.kubelet.wait_registered({RESOURCE_GPU})
    a, b = sorted([p.gpu(0).uuid, p.gpu(2).uuid])
    p.pods.items = [pod("train", "l4-0", whole("main", a, b))]
    response = allocate(p.kubelet.plugin(RESOURCE_GPU), [b, a]).container_responses[0]
    expected_envs = {k: v.format(a=a, b=b) for k, v in envs.items()}
    assert dict(response.envs) == {**expected_envs, "INFERGRID_GPU_MEMORY_MIB": "23034"}
    assert mounted(response) == [m.format(a=a, b=b) for m in mounts]
    assert [d.name for d in response.cdi_devices] == [c.format(a=a, b=b) for c in cdi]


def test_a_multi_container_pod_gets_each_container_its_own_share(start_plugin):
    p = start_plugin("l4-0")
    p.kubelet.wait_registered({RESOURCE_VGPU})
    g0, g1 = p.gpu(0).uuid, p.gpu(1).uuid
    p.pods.items = [pod("duo", "l4-0", share("a", g0, 4096), share("b", g1, 6144))]
    stub = p.kubelet.plugin(RESOURCE_VGPU)
    second = allocate(stub, [f"{g1}::vgpu-0"]).container_responses[0].envs
    first = allocate(stub, [f"{g0}::vgpu-0"]).container_responses[0].envs
    assert (first["INFERGRID_GPU_MEMORY_MIB"], second["INFERGRID_GPU_MEMORY_MIB"]) == (
        "4096",
        "6144",
    )
    assert [g.pending.container.name for g in p.granted] == ["b", "a"]


def test_oldest_unallocated_assignment_is_honoured_first(start_plugin):
    p = start_plugin("l4-0")
    p.kubelet.wait_registered({RESOURCE_VGPU})
    g = p.gpu(0).uuid
    p.pods.items = [
        pod("young", "l4-0", share("c", g, 1000), age_s=20),
        pod("old", "l4-0", share("c", g, 2000), age_s=10),
    ]
    stub = p.kubelet.plugin(RESOURCE_VGPU)
    allocate(stub, [f"{g}::vgpu-0"])
    allocate(stub, [f"{g}::vgpu-1"])
    assert [x.pending.pod.name for x in p.granted] == ["old", "young"]


def test_two_pods_racing_for_one_gpu_get_it_once(start_plugin):
    """Two assignments that together over-commit GPU 0: exactly one is honoured."""
    p = start_plugin("l4-0")
    p.kubelet.wait_registered({RESOURCE_VGPU})
    g = p.gpu(0).uuid
    p.pods.items = [
        pod("first", "l4-0", share("c", g, 16384)),
        pod("second", "l4-0", share("c", g, 16384), age_s=1),
    ]
    stub = p.kubelet.plugin(RESOURCE_VGPU)
    barrier = threading.Barrier(2)

    def race(slot: int):
        barrier.wait()
        try:
            allocate(stub, [f"{g}::vgpu-{slot}"])
            return "granted"
        except grpc.RpcError as err:
            return err.details()

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(race, [0, 1]))
    assert results.count("granted") == 1
    (refusal,) = [r for r in results if r != "granted"]
    assert f"{g} (index 0): " in refusal and "MiB free, needs" in refusal
    assert len(p.granted) == 1


@pytest.mark.parametrize(
    ("pods", "ids", "message"),
    [
        (lambda g: [], lambda g: ["GPU-nope"], "unknown device IDs: GPU-nope"),
        (lambda g: [], lambda g: [g], "no unallocated whole assignment on node l4-0"),
        (
            lambda g: [pod("rogue", "l4-0", whole("c", g), scheduler="default-scheduler")],
            lambda g: [g],
            f"was not scheduled by {SCHEDULER_NAME}",
        ),
        (
            lambda g: [pod("elsewhere", "l4-1", whole("c", g))],
            lambda g: [g],
            "no unallocated whole assignment",
        ),
    ],
    ids=["unknown device", "no assignment", "other scheduler", "assignment for another node"],
)
def test_refused_requests_say_what_is_missing_and_change_nothing(start_plugin, pods, ids, message):
    p = start_plugin("l4-0")
    p.kubelet.wait_registered({RESOURCE_GPU})
    g = p.gpu(0).uuid
    p.pods.items = pods(g)
    stub = p.kubelet.plugin(RESOURCE_GPU)
    with pytest.raises(grpc.RpcError) as refused:
        allocate(stub, ids(g))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert message in refused.value.details()
    assert p.granted == [] and p.runtime.manager.ledger.honoured == {}
    p.pods.items = [pod("valid", "l4-0", whole("c", g))]
    assert mounted(allocate(stub, [g]).container_responses[0]) == [g]


def test_allocate_refuses_when_the_api_server_does_not_answer(start_plugin):
    """Fail closed: no pods to check means no GPU, and the kubelet is told why."""
    core = FakeCore(error=timed_out())
    p = start_plugin("l4-0", pods=KubePods(core, "l4-0"))
    p.kubelet.wait_registered({RESOURCE_GPU})
    with pytest.raises(grpc.RpcError) as refused:
        allocate(p.kubelet.plugin(RESOURCE_GPU), [p.gpu(0).uuid])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "the API server did not list the pods of node l4-0" in refused.value.details()
    assert "ReadTimeoutError" in refused.value.details()
    assert p.granted == [] and p.runtime.manager.ledger.honoured == {}
    # Every listing is bounded: Allocate's, and the telemetry's (with no kubelet PodResources
    # here, it reads who holds what from the pods' assignments).
    assert core.timeouts and set(core.timeouts) == {API_TIMEOUT_S}


def test_stop_removes_every_socket(start_plugin):
    p = start_plugin("l4-0")
    p.kubelet.wait_registered({RESOURCE_GPU, RESOURCE_VGPU})
    sockets = [p.kubelet.plugin_dir / r.endpoint for r in p.kubelet.registrations]
    started = time.monotonic()
    p.runtime.stop()
    assert time.monotonic() - started < 30
    assert not any(s.exists() for s in sockets)
