"""A pod that names GPU models or a least compute capability is placed only on such GPUs,
GPU by GPU, so a mixed node serves it from the GPUs that suit it."""

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from infergrid.gpu_models import GpuConstraint
from infergrid.placement import fit
from infergrid.placement.fit import surely_unfit

from .builders import A100_MIB, BINPACK, gpu, inventory, node_of, pod, share, whole

T4 = replace(gpu(0, memory=15360, model="Tesla T4"), compute_capability="7.5")
A100 = replace(gpu(1, memory=A100_MIB, model="NVIDIA A100-SXM4-80GB"), compute_capability="8.0")
L4 = replace(gpu(2), compute_capability="8.9")
MIXED = node_of(inventory(T4, A100, L4))


def constrained(*containers, models=(), at_least=None):
    return replace(pod(*containers), gpu_constraint=GpuConstraint(tuple(models), at_least))


def placed_gpus(result) -> list[str]:
    return [g.uuid for c in result.placements for g in c.gpus]


def test_on_a_mixed_node_only_the_gpus_of_an_asked_model_are_chosen():
    result = fit(constrained(whole(1), models=["a100-80gb"]), MIXED, BINPACK)
    assert placed_gpus(result) == ["GPU-1"]
    shared = fit(constrained(share(4096), models=["NVIDIA L4", "Tesla T4"]), MIXED, BINPACK)
    assert placed_gpus(shared)[0] in {"GPU-0", "GPU-2"}


def test_the_reservation_is_made_on_the_whole_node():
    result = fit(constrained(whole(1), models=["a100-80gb"]), MIXED, BINPACK)
    assert [g.uuid for g in result.after.gpus] == ["GPU-0", "GPU-1", "GPU-2"]
    assert [g.busy for g in result.after.gpus] == [False, True, False]


def test_a_node_without_an_asked_model_is_refused_naming_what_was_asked_and_found():
    result = fit(constrained(whole(1), models=["h100-80gb"]), node_of(inventory(L4)), BINPACK)
    assert not result.fits
    assert result.reasons == (
        "GPU-2 (index 2): GPU model h100-80gb asked for, found NVIDIA L4 (l4-24gb)",
    )
    assert surely_unfit(constrained(whole(1), models=["h100-80gb"]), node_of(inventory(L4)), None)


def test_a_least_compute_capability_keeps_older_gpus_out():
    result = fit(constrained(whole(2), at_least=(8, 0)), MIXED, BINPACK)
    assert sorted(placed_gpus(result)) == ["GPU-1", "GPU-2"]
    refused = fit(constrained(whole(3), at_least=(8, 0)), MIXED, BINPACK)
    assert not refused.fits
    assert any("compute capability 8.0 or more asked for, found 7.5" in r for r in refused.reasons)


def test_when_the_suitable_gpus_are_busy_the_reasons_say_so_and_name_the_others():
    busy = fit(constrained(whole(1), models=["a100-80gb"]), MIXED, BINPACK).after
    again = fit(constrained(whole(1), models=["a100-80gb"]), busy, BINPACK)
    assert not again.fits
    assert again.reasons[0].endswith("0 of 1 GPUs free, needs 1: 1 held whole by another pod")
    assert any("found Tesla T4" in r for r in again.reasons)


@given(
    st.lists(st.sampled_from([T4, A100, L4]), min_size=1, max_size=3, unique=True),
    st.lists(st.sampled_from(["t4-16gb", "a100-80gb", "NVIDIA L4", "h100-80gb"]), max_size=3),
    st.sampled_from([None, (7, 5), (8, 0), (8, 9), (9, 0)]),
    st.integers(1, 3),
)
def test_a_placement_only_ever_uses_gpus_that_satisfy_the_constraint(gpus, models, least, n):
    constraint = GpuConstraint(tuple(models), least)
    node = node_of(inventory(*gpus))
    result = fit(replace(pod(whole(n)), gpu_constraint=constraint), node, BINPACK)
    suits = {
        g.uuid
        for g in gpus
        if constraint.why_not(g.model, g.memory_mib, g.compute_capability) is None
    }
    assert result.fits == (len(suits) >= n)
    assert set(placed_gpus(result)) <= suits
