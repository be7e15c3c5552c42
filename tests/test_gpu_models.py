"""GPU models a pod accepts: names, the annotations the extender reads, the node affinity."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infergrid.errors import ContractError
from infergrid.gpu_models import (
    GpuConstraint,
    compute_level,
    constraint_annotations,
    label_value,
    node_affinity,
    read_constraint,
    short_name,
)


@pytest.mark.parametrize(
    ("model", "memory_mib", "short"),
    [
        ("NVIDIA A100-SXM4-80GB", 81920, "a100-80gb"),
        ("NVIDIA A100-PCIE-40GB", 40960, "a100-40gb"),
        ("NVIDIA H100 80GB HBM3", 81559, "h100-80gb"),
        ("NVIDIA H200", 143771, "h200-141gb"),
        ("Tesla T4", 15360, "t4-16gb"),
        ("NVIDIA L4", 23034, "l4-24gb"),
        ("NVIDIA A10", 24576, "a10-24gb"),
        ("NVIDIA GeForce RTX 4090", 24564, "rtx4090-24gb"),
        ("NVIDIA L40S", 46068, "l40s-48gb"),
        ("Tesla V100-SXM2-16GB", 16384, "v100-16gb"),
    ],
)
def test_short_names_are_the_family_and_the_marketed_size(model, memory_mib, short):
    assert short_name(model, memory_mib) == short


@given(st.text(max_size=80), st.integers(0, 2**22))
def test_a_short_name_is_always_a_valid_label_value(model, memory_mib):
    name = short_name(model, memory_mib)
    assert name == label_value(name) and name.endswith("gb")


A100 = ("NVIDIA A100-SXM4-80GB", 81920, "8.0")
L4 = ("NVIDIA L4", 23034, "8.9")
T4 = ("Tesla T4", 15360, "7.5")


@pytest.mark.parametrize("name", ["NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB", "a100-80gb"])
def test_a_model_may_be_named_as_nvml_reports_it_as_its_label_or_by_short_name(name):
    assert GpuConstraint((name,)).why_not(*A100) is None


def test_the_reason_names_the_model_asked_for_and_the_one_found():
    reason = GpuConstraint(("a100-80gb", "NVIDIA H100 80GB HBM3")).why_not(*L4)
    assert (
        reason == "GPU model a100-80gb, NVIDIA H100 80GB HBM3 asked for, found NVIDIA L4 (l4-24gb)"
    )


def test_compute_capability_is_compared_as_a_version():
    at_least = GpuConstraint(min_capability=(8, 6))
    assert at_least.why_not(*L4) is None
    assert at_least.why_not(*A100) == (
        "compute capability 8.6 or more asked for, found 8.0 on NVIDIA A100-SXM4-80GB (a100-80gb)"
    )
    assert GpuConstraint(min_capability=(10, 0)).why_not(*L4) is not None
    assert GpuConstraint().why_not(*T4) is None


def test_annotations_round_trip_and_an_empty_constraint_writes_none():
    constraint = GpuConstraint(("a100-80gb", "NVIDIA L4"), (8, 0))
    annotations = constraint_annotations(constraint)
    assert annotations == {
        "infergrid.io/gpu-models": "a100-80gb,NVIDIA L4",
        "infergrid.io/min-compute-capability": "8.0",
    }
    assert read_constraint(annotations) == constraint
    assert constraint_annotations(GpuConstraint()) == {}
    assert read_constraint({}) == GpuConstraint()


@pytest.mark.parametrize(
    ("annotations", "field"),
    [
        ({"infergrid.io/gpu-models": ""}, "metadata.annotations[infergrid.io/gpu-models][0]"),
        ({"infergrid.io/gpu-models": "a,,b"}, "metadata.annotations[infergrid.io/gpu-models][1]"),
        ({"infergrid.io/gpu-models": ",".join("m" * 17)}, "infergrid.io/gpu-models"),
        ({"infergrid.io/gpu-models": "x" * 200}, "infergrid.io/gpu-models"),
        ({"infergrid.io/gpu-models": 3}, "infergrid.io/gpu-models"),
        ({"infergrid.io/min-compute-capability": "eight"}, "min-compute-capability"),
        ({"infergrid.io/min-compute-capability": "8.10"}, "min-compute-capability"),
        ({"infergrid.io/min-compute-capability": 8.0}, "min-compute-capability"),
    ],
)
def test_a_bad_annotation_is_refused_naming_it(annotations, field):
    with pytest.raises(ContractError) as err:
        read_constraint(annotations)
    assert field in err.value.field


def test_compute_level_orders_capabilities_and_never_fails_on_an_odd_report():
    levels = [compute_level(c) for c in ("7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.1")]
    assert levels == sorted(levels) == [75, 80, 86, 89, 90, 100, 121]
    assert compute_level("unknown") == 0


def test_affinity_keeps_nodes_labelled_with_an_asked_model_or_mixed_above_the_level():
    affinity = node_affinity(GpuConstraint(("NVIDIA A100-SXM4-80GB", "l4-24gb"), (8, 0)))
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    level = {"key": "infergrid.io/gpu.compute-level", "operator": "Gt", "values": ["79"]}
    values = ["NVIDIA-A100-SXM4-80GB", "l4-24gb"]
    assert terms == [
        {"matchExpressions": [
            {"key": "infergrid.io/gpu.product", "operator": "In", "values": values}, level]},
        {"matchExpressions": [
            {"key": "infergrid.io/gpu.model", "operator": "In", "values": values}, level]},
        {"matchExpressions": [
            {"key": "infergrid.io/gpu.mixed", "operator": "In", "values": ["true"]}, level]},
    ]  # fmt: skip


def test_affinity_with_only_a_least_capability_is_one_term_and_none_without_a_constraint():
    affinity = node_affinity(GpuConstraint(min_capability=(9, 0)))
    (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == {"matchExpressions": [
        {"key": "infergrid.io/gpu.compute-level", "operator": "Gt", "values": ["89"]}]}  # fmt: skip
    assert node_affinity(GpuConstraint()) is None
