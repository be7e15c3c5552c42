"""Re-checking a decided assignment: what the device plugin's Allocate gate asks the core."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infergrid.constants import RESOURCE_GPU, RESOURCE_GPU_CORES, RESOURCE_GPU_MEMORY, RESOURCE_VGPU
from infergrid.placement import fit, recheck

from .builders import (
    BINPACK,
    L4_MIB,
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
A100 = inventory(gpu(0, memory=81920, model="NVIDIA A100", mig=("3g.40gb", "3g.40gb")))


def resources(shortfalls) -> list[str]:
    return [s.resource for s in shortfalls]


def test_a_share_that_fits_passes():
    (asked,) = held_share(0, 4096, 30, name="c").containers
    assert recheck(node_of(L4X2, [held_share(0, 8192, 50)]), asked) == ()


def test_a_share_beyond_free_memory_and_sms_names_both_and_the_container():
    (asked,) = held_share(0, L4_MIB - 8191, 51, name="c").containers
    found = recheck(node_of(L4X2, [held_share(0, 8192, 50)]), asked)
    assert resources(found) == [RESOURCE_GPU_MEMORY, RESOURCE_GPU_CORES]
    assert all(s.message.startswith("container 'c': GPU-0 (index 0): ") for s in found)
    assert "16384 MiB free, needs 16385" in found[0].reason


def test_a_share_of_a_gpu_held_whole_is_refused():
    (asked,) = held_share(1, 1, 1).containers
    (found,) = recheck(node_of(L4X2, [held_whole(1)]), asked)
    assert (found.resource, found.reason) == (
        RESOURCE_VGPU,
        "GPU-1 (index 1): held whole by another pod",
    )


def test_a_whole_gpu_holding_a_share_is_refused_and_a_free_one_passes():
    (asked,) = held_whole(0, 1).containers
    (found,) = recheck(node_of(L4X2, [held_share(0, 1, 1)]), asked)
    assert (found.gpu, found.resource) == ("GPU-0", RESOURCE_GPU)
    (free,) = held_whole(1).containers
    assert recheck(node_of(L4X2, [held_share(0, 1, 1)]), free) == ()


def test_a_mig_instance_already_taken_is_refused_and_found_by_its_own_uuid():
    (asked,) = held_mig("MIG-0-0", parent=7).containers  # a wrong gpuUuid does not hide it
    assert recheck(node_of(A100), asked) == ()
    (found,) = recheck(node_of(A100, [held_mig("MIG-0-0", 0)]), asked)
    assert found.resource == "nvidia.com/mig-3g.40gb" and "already taken" in found.reason


def test_what_the_node_does_not_have_is_named():
    (asked,) = held_whole(5).containers
    (found,) = recheck(node_of(L4X2), asked)
    assert found.gpu == "GPU-5" and "no GPU or MIG instance GPU-5 on node node-a" in found.reason


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1), st.integers(1, 16384), st.integers(1, 100)), max_size=5),
    st.sampled_from([share(8192, 30), share(20000, 10), share(1024, 90), whole(1), whole(2)]),
)
def test_whatever_fit_places_passes_the_recheck(held, request):
    """The gate never refuses what the scheduler decided on the same node."""
    node = node_of(L4X2, [held_share(i, mib, cores) for i, mib, cores in held])
    for container in fit(pod(request), node, BINPACK).placements:
        assert recheck(node, container) == ()


def test_a_mig_instance_fit_places_passes_the_recheck():
    node = node_of(A100, [held_mig("MIG-0-1", 0)])
    (container,) = fit(pod(mig("3g.40gb")), node, BINPACK).placements
    assert recheck(node, container) == ()


@pytest.mark.parametrize("memory, cores", [(1, 1), (L4_MIB, 100)])
def test_an_idle_gpu_takes_any_share_that_its_size_allows(memory, cores):
    (asked,) = held_share(0, memory, cores).containers
    assert recheck(node_of(L4X2), asked) == ()
