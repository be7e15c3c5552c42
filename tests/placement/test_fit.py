"""fit: the placement of every GPU container, or every shortfall with its numbers."""

from dataclasses import dataclass, field, replace
from datetime import timedelta

import pytest

from infergrid.assignment_annotation import AssignedGpu, AssignedMig, ContainerAssignment
from infergrid.constants import (
    ANNOTATION_GPU_USAGE,
    ANNOTATION_TOPOLOGY,
    RESOURCE_GPU,
    RESOURCE_GPU_CORES,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
    mig_resource,
)
from infergrid.placement import (
    Demand,
    NodeState,
    Policy,
    Shortfall,
    Workload,
    apply,
    build_node_state,
    fit,
    resolve_policy,
)
from infergrid.pod_request import PodGpuRequest

from .builders import (
    A100_MIB,
    BINPACK,
    NOW,
    SPREAD,
    STALE_AFTER,
    gpu,
    held_mig,
    held_share,
    held_whole,
    inventory,
    mig,
    node_of,
    pod,
    share,
    whole,
)

L4X2 = inventory(gpu(0), gpu(1))
A100 = "NVIDIA A100-SXM4-80GB"
MIG_NODE = inventory(gpu(0, A100_MIB, A100, mig=("3g.40gb", "3g.40gb")), gpu(1, A100_MIB, A100))
NVLINKED_2_3 = inventory(
    gpu(0, numa=0), gpu(1, numa=0), gpu(2, numa=1), gpu(3, numa=1), nvlink={(2, 3): 4}
)
FGD_SHARE = resolve_policy("fgd", Workload(((Demand(memory_mib=12288, cores=40), 1.0),)))


def shared_on(index: int, memory: int, cores: int, name: str = "engine") -> ContainerAssignment:
    gpus = (AssignedGpu(f"GPU-{index}", memory, cores),)
    return ContainerAssignment(name, gpus=gpus, shared=True)


def whole_on(*indices: int, memory: int = 24576, name: str = "engine") -> ContainerAssignment:
    return ContainerAssignment(
        name, gpus=tuple(AssignedGpu(f"GPU-{i}", memory, 100) for i in indices)
    )


def mig_on(uuid: str, parent: int, name: str = "engine") -> ContainerAssignment:
    return ContainerAssignment(name, mig=AssignedMig(uuid, "3g.40gb", f"GPU-{parent}"))


def short(
    gpu_uuid: str | None, resource: str, free: int, needed: int, reason: str, container="engine"
) -> Shortfall:
    return Shortfall(gpu_uuid, resource, free, needed, reason, container)


@dataclass(frozen=True)
class Case:
    name: str
    node: NodeState
    request: PodGpuRequest
    placements: tuple[ContainerAssignment, ...] = ()
    shortfalls: tuple[Shortfall, ...] = field(default=())
    policy: Policy = BINPACK


CASES = [
    Case(
        "binpack puts a share on the fullest GPU that fits",
        node_of(L4X2, [held_share(1, 8192, 30)]),
        pod(share(8192, 30)),
        placements=(shared_on(1, 8192, 30),),
    ),
    Case(
        "spread puts a share on the emptiest GPU",
        node_of(L4X2, [held_share(1, 8192, 30)]),
        pod(share(8192, 30)),
        placements=(shared_on(0, 8192, 30),),
        policy=SPREAD,
    ),
    Case(
        "fgd puts a share where it leaves no sliver the workload cannot use",
        node_of(L4X2, [held_share(1, 8192, 30)]),
        pod(share(12288, 40)),
        placements=(shared_on(0, 12288, 40),),
        policy=FGD_SHARE,
    ),
    Case(
        "every shortfall of every GPU is reported, not just the first",
        node_of(
            inventory(gpu(0), gpu(1, healthy=False), gpu(2), gpu(3)),
            [held_share(0, 20480, 90), held_whole(2)],
            missing=(3,),
        ),
        pod(share(8192, 20)),
        shortfalls=(
            short(
                "GPU-0",
                RESOURCE_GPU_MEMORY,
                4096,
                8192,
                "GPU-0 (index 0): 4096 MiB free, needs 8192",
            ),
            short(
                "GPU-0", RESOURCE_GPU_CORES, 10, 20, "GPU-0 (index 0): 10% of SMs free, needs 20%"
            ),
            short("GPU-1", RESOURCE_VGPU, 0, 1, "GPU-1 (index 1): unhealthy"),
            short("GPU-2", RESOURCE_VGPU, 0, 1, "GPU-2 (index 2): held whole by another pod"),
            short(
                "GPU-3",
                RESOURCE_VGPU,
                0,
                1,
                "GPU-3 (index 3): no usage sample in the node's heartbeat",
            ),
        ),
    ),
    Case(
        "a stale heartbeat offers nothing, and says so once",
        node_of(L4X2, heartbeat=NOW - STALE_AFTER - timedelta(seconds=1)),
        pod(share(1024, 10), whole(1, name="second")),
        shortfalls=(
            short(
                None,
                ANNOTATION_GPU_USAGE,
                0,
                0,
                "node heartbeat is stale: last at 2025-03-01T11:59:29+00:00",
                container="",
            ),
        ),
    ),
    Case(
        "no usage at all is stale too",
        build_node_state(L4X2, None, (), NOW, STALE_AFTER),
        pod(whole(1)),
        shortfalls=(
            short(
                None,
                ANNOTATION_GPU_USAGE,
                0,
                0,
                "node heartbeat is stale: no GPU usage published",
                container="",
            ),
        ),
    ),
    Case(
        "an unhealthy GPU is passed over",
        node_of(inventory(gpu(0, healthy=False), gpu(1))),
        pod(share(1024, 10)),
        placements=(shared_on(1, 1024, 10),),
    ),
    Case(
        "measured use above assignments shrinks free memory",
        node_of(inventory(gpu(0)), [held_share(0, 4096, 10)], used={0: 20000}),
        pod(share(8192, 10)),
        shortfalls=(
            short(
                "GPU-0",
                RESOURCE_GPU_MEMORY,
                4576,
                8192,
                "GPU-0 (index 0): 4576 MiB free, needs 8192"
                " (20000 MiB measured in use, 4096 assigned)",
            ),
        ),
    ),
    Case(
        "a share never lands on a GPU held whole, however full binpack likes it",
        node_of(L4X2, [held_whole(0)]),
        pod(share(1024, 10)),
        placements=(shared_on(1, 1024, 10),),
    ),
    Case(
        "a whole GPU never goes to a shared one",
        node_of(L4X2, [held_share(0, 1024, 10)]),
        pod(whole(1)),
        placements=(whole_on(1),),
    ),
    Case(
        "too few free GPUs: the count, then the busy ones counted by cause",
        node_of(inventory(gpu(0), gpu(1), gpu(2)), [held_share(1, 1024, 10)], used={2: 2000}),
        pod(whole(2)),
        shortfalls=(
            short(
                None,
                RESOURCE_GPU,
                1,
                2,
                "1 of 3 GPUs free, needs 2: 1 holding shares, 1 in use outside assignments",
            ),
        ),
    ),
    Case(
        "nvlink topology takes the NVLink pair",
        node_of(NVLINKED_2_3),
        pod(whole(2), topology="nvlink"),
        placements=(whole_on(2, 3),),
    ),
    Case(
        "without topology the best-linked set is still preferred",
        node_of(NVLINKED_2_3),
        pod(whole(2)),
        placements=(whole_on(2, 3),),
    ),
    Case(
        "without NVLink, whole GPUs stay on one NUMA node",
        node_of(inventory(gpu(0, numa=0), gpu(1, numa=1), gpu(2, numa=0))),
        pod(whole(2)),
        placements=(whole_on(0, 2),),
    ),
    Case(
        "nvlink topology with no connected pair left",
        node_of(NVLINKED_2_3, [held_whole(3)]),
        pod(whole(2), topology="nvlink"),
        shortfalls=(
            short(
                None,
                ANNOTATION_TOPOLOGY,
                1,
                2,
                "no NVLink-connected set of 2 free GPUs (largest has 1 of 3 free)",
            ),
        ),
    ),
    Case(
        "a MIG request takes a free instance of its profile",
        node_of(MIG_NODE, [held_mig("MIG-0-0", 0)]),
        pod(mig("3g.40gb")),
        placements=(mig_on("MIG-0-1", 0),),
    ),
    Case(
        "no free MIG instance",
        node_of(MIG_NODE, [held_mig("MIG-0-0", 0), held_mig("MIG-0-1", 0)]),
        pod(mig("3g.40gb")),
        shortfalls=(
            short(None, mig_resource("3g.40gb"), 0, 1, "no free MIG 3g.40gb instance (2 taken)"),
        ),
    ),
    Case(
        "MIG instances of an unhealthy GPU are not offered",
        node_of(inventory(gpu(0, A100_MIB, A100, healthy=False, mig=("3g.40gb",)))),
        pod(mig("3g.40gb")),
        shortfalls=(
            short(
                None,
                mig_resource("3g.40gb"),
                0,
                1,
                "no free MIG 3g.40gb instance (1 on unavailable GPUs)",
            ),
        ),
    ),
    Case(
        "a GPU in MIG mode is never shared or given whole",
        node_of(inventory(gpu(0, A100_MIB, A100, mig=("3g.40gb",)))),
        pod(share(1024, 10), whole(1, name="second")),
        shortfalls=(
            short(
                "GPU-0",
                RESOURCE_VGPU,
                0,
                1,
                "GPU-0 (index 0): in MIG mode, offers only MIG instances",
            ),
            short(
                None,
                RESOURCE_GPU,
                0,
                1,
                "0 of 1 GPUs free, needs 1: 1 in MIG mode",
                container="second",
            ),
        ),
    ),
    Case(
        "containers are placed one after another: the second sees the first",
        node_of(inventory(gpu(0))),
        pod(share(16384, 50, name="a"), share(16384, 50, name="b")),
        shortfalls=(
            short(
                "GPU-0",
                RESOURCE_GPU_MEMORY,
                8192,
                16384,
                "GPU-0 (index 0): 8192 MiB free, needs 16384",
                container="b",
            ),
        ),
    ),
    Case(
        "an init container keeps its share for the pod's life",
        node_of(inventory(gpu(0))),
        pod(share(16384, 30, name="init", init=True), share(16384, 30, name="app")),
        shortfalls=(
            short(
                "GPU-0",
                RESOURCE_GPU_MEMORY,
                8192,
                16384,
                "GPU-0 (index 0): 8192 MiB free, needs 16384",
                container="app",
            ),
        ),
    ),
    Case(
        "two containers get different GPUs",
        node_of(L4X2),
        pod(whole(1, name="a"), whole(1, name="b")),
        placements=(whole_on(0, name="a"), whole_on(1, name="b")),
    ),
    Case(
        "a pod without GPU containers fits even a stale node",
        node_of(L4X2, heartbeat=NOW - timedelta(hours=1)),
        pod(),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fit(case: Case):
    result = fit(case.request, case.node, case.policy)
    assert result.shortfalls == case.shortfalls
    assert result.placements == case.placements
    assert result.fits == (not case.shortfalls)
    if result.fits:
        assert result.after == apply(case.node, case.placements)
    else:
        assert result.after is None


def test_three_8_gib_shares_fit_a_24_gib_gpu_and_a_fourth_does_not():
    node = node_of(inventory(gpu(0, memory=24576)))
    for _ in range(3):
        result = fit(pod(share(8192, 30)), node, BINPACK)
        assert result.fits
        node = result.after
    fourth = fit(pod(share(8192, 10)), node, BINPACK)
    assert fourth.reasons == ("container 'engine': GPU-0 (index 0): 0 MiB free, needs 8192",)


def test_a_share_of_the_whole_gpu_is_still_a_share():
    result = fit(pod(share(24576, 100)), node_of(inventory(gpu(0))), BINPACK)
    (held,) = result.after.gpus
    assert (held.shares, held.holders, held.free_mib, held.free_cores) == (1, 0, 0, 0)
    assert result.placements == (shared_on(0, 24576, 100),)


def test_a_whole_gpu_is_assigned_all_its_memory_and_sms():
    result = fit(pod(whole(1)), node_of(inventory(gpu(0, memory=A100_MIB))), BINPACK)
    assert result.placements == (whole_on(0, memory=A100_MIB),)
    assert result.after.gpus[0].holders == 1


def test_shares_without_cores_are_limited_by_memory_and_share_slots():
    node = node_of(replace(inventory(gpu(0, memory=24576)), share_slots=2))
    for _ in range(2):
        result = fit(pod(share(4096, 0)), node, BINPACK)
        assert result.fits
        node = result.after
    third = fit(pod(share(4096, 0)), node, BINPACK)
    assert third.reasons == ("container 'engine': GPU-0 (index 0): all 2 share slots taken",)
