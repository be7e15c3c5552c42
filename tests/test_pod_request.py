"""A pod's GPU request: the rules every part applies before looking at any node."""

import pytest

from infergrid.errors import ContractError
from infergrid.gpu_models import GpuConstraint
from infergrid.pod_request import ContainerGpuRequest, PodGpuRequest, parse_pod_request

GPU = "nvidia.com/gpu"
VGPU = "infergrid.io/vgpu"
MEMORY = "infergrid.io/gpu-memory"
CORES = "infergrid.io/gpu-cores"
MIG = "nvidia.com/mig-1g.10gb"


def container(
    name: str = "engine", limits: dict | None = None, requests: dict | None = None
) -> dict:
    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v is not None}
    return {"name": name, "image": "engine:1", "resources": resources}


def pod(*containers: dict, init: tuple[dict, ...] = (), annotations: dict | None = None) -> dict:
    spec: dict = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    metadata = {"name": "p"} if annotations is None else {"name": "p", "annotations": annotations}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def only(limits: dict) -> ContainerGpuRequest:
    (request,) = parse_pod_request(pod(container(limits=limits))).containers
    return request


def test_whole_gpus():
    assert only({GPU: 2, "cpu": "500m"}) == ContainerGpuRequest("engine", "whole", gpus=2)


def test_a_share_with_memory_and_cores():
    assert only({VGPU: 1, MEMORY: "8192", CORES: "30"}) == ContainerGpuRequest(
        "engine", "share", gpus=1, memory_mib=8192, cores=30
    )


def test_a_share_without_cores_may_use_every_sm():
    assert only({VGPU: "1", MEMORY: 4096}).cores == 0  # no SMs reserved


def test_a_mig_instance():
    assert only({MIG: 1}) == ContainerGpuRequest("engine", "mig", mig_profile="1g.10gb")


def test_a_container_without_gpu_resources_asks_for_none():
    assert only({"cpu": "1", "memory": "1Gi"}) == ContainerGpuRequest("engine", "none")
    (request,) = parse_pod_request(pod({"name": "bare"})).containers
    assert request.kind == "none"


def test_zero_counts_ask_for_nothing():
    assert only({GPU: 0, VGPU: "0", MIG: 0}).kind == "none"


def test_requests_are_read_when_limits_are_absent_and_must_agree_when_both_are_set():
    (request,) = parse_pod_request(pod(container(requests={GPU: "1"}))).containers
    assert request.gpus == 1
    (request,) = parse_pod_request(pod(container(limits={GPU: 1}, requests={GPU: "1"}))).containers
    assert request.gpus == 1


def test_init_containers_come_first_and_gpu_containers_skips_the_rest():
    request = parse_pod_request(
        pod(
            container("a", {GPU: 1}),
            container("b"),
            init=(container("setup", {VGPU: 1, MEMORY: 10}),),
        )
    )
    assert [(c.name, c.init) for c in request.containers] == [
        ("setup", True),
        ("a", False),
        ("b", False),
    ]
    assert [c.name for c in request.gpu_containers] == ["setup", "a"]


def test_policy_and_topology_come_from_annotations():
    annotations = {"infergrid.io/placement-policy": "fgd", "infergrid.io/topology": "nvlink"}
    request = parse_pod_request(pod(container(limits={GPU: 4}), annotations=annotations))
    assert (request.policy, request.topology) == ("fgd", "nvlink")


def test_gpu_models_and_a_least_compute_capability_come_from_annotations():
    annotations = {"infergrid.io/gpu-models": "a100-80gb,NVIDIA L4",
                   "infergrid.io/min-compute-capability": "8.0"}  # fmt: skip
    request = parse_pod_request(pod(container(limits={GPU: 1}), annotations=annotations))
    assert request.gpu_constraint == GpuConstraint(("a100-80gb", "NVIDIA L4"), (8, 0))
    assert parse_pod_request(pod(container(limits={GPU: 1}))).gpu_constraint.empty


def test_without_annotations_the_policy_is_the_default():
    request = parse_pod_request(pod(container()))
    assert request == PodGpuRequest(
        (ContainerGpuRequest("engine", "none"),), "fgd-cluster-aware", None
    )
    assert parse_pod_request(pod(container()), default_policy="spread").policy == "spread"


LIMITS = "spec.containers[0].resources.limits"
REQUESTS = "spec.containers[0].resources.requests"

RULES = [
    ("memory without vgpu", {MEMORY: 1024}, f"{LIMITS}[{MEMORY}]", "vgpu"),
    ("cores without vgpu", {GPU: 1, CORES: 50}, f"{LIMITS}[{CORES}]", "vgpu"),
    ("vgpu above 1", {VGPU: 2, MEMORY: 1024}, f"{LIMITS}[{VGPU}]", "ask nvidia.com/gpu for more"),
    ("vgpu without memory", {VGPU: 1}, f"{LIMITS}[{MEMORY}]", "memory"),
    ("zero memory", {VGPU: 1, MEMORY: 0}, f"{LIMITS}[{MEMORY}]", "at least 1 MiB"),
    ("zero cores", {VGPU: 1, MEMORY: 10, CORES: 0}, f"{LIMITS}[{CORES}]", "from 1 to 100"),
    ("cores above 100", {VGPU: 1, MEMORY: 10, CORES: 101}, f"{LIMITS}[{CORES}]", "from 1 to 100"),
    (
        "share with whole gpus",
        {VGPU: 1, MEMORY: 10, GPU: 1},
        f"{LIMITS}[{GPU}]",
        "cannot be combined",
    ),
    ("mig with whole gpus", {MIG: 1, GPU: 1}, f"{LIMITS}[{GPU}]", "cannot be combined"),
    ("mig with a share", {MIG: 1, VGPU: 1, MEMORY: 10}, f"{LIMITS}[{VGPU}]", "cannot be combined"),
    ("mig with memory", {MIG: 1, MEMORY: 10}, f"{LIMITS}[{MEMORY}]", "cannot be combined"),
    (
        "two mig profiles",
        {MIG: 1, "nvidia.com/mig-2g.20gb": 1},
        f"{LIMITS}[nvidia.com/mig-2g.20gb]",
        "second MIG profile",
    ),
    ("two mig instances", {MIG: 2}, f"{LIMITS}[{MIG}]", "exactly one MIG instance"),
    (
        "not a mig profile",
        {"nvidia.com/mig-big": 1},
        f"{LIMITS}[nvidia.com/mig-big]",
        "not a MIG profile",
    ),
    (
        "unknown infergrid resource",
        {"infergrid.io/gpu-memroy": 10},
        f"{LIMITS}[infergrid.io/gpu-memroy]",
        "unknown resource",
    ),
]


@pytest.mark.parametrize(
    ("limits", "field", "says"), [r[1:] for r in RULES], ids=[r[0] for r in RULES]
)
def test_each_rule_names_the_resource_and_the_container(limits, field, says):
    with pytest.raises(ContractError) as raised:
        parse_pod_request(pod(container("engine-7", limits)))
    assert raised.value.field == field
    assert says in raised.value.reason
    assert "'engine-7'" in raised.value.reason


def test_limits_and_requests_that_differ_are_refused_at_the_request():
    with pytest.raises(ContractError, match="requests 2 but limits 1") as raised:
        parse_pod_request(pod(container(limits={GPU: 1}, requests={GPU: 2})))
    assert raised.value.field == f"{REQUESTS}[{GPU}]"


def test_a_share_missing_memory_is_reported_where_the_vgpu_was_asked():
    with pytest.raises(ContractError) as raised:
        parse_pod_request(pod(container(requests={VGPU: 1})))
    assert raised.value.field == f"{REQUESTS}[{MEMORY}]"


def test_quantities_in_the_api_servers_canonical_form_are_read():
    """The API server stores 20000 as 20k; every whole-number spelling means the same."""
    assert only({VGPU: "1", MEMORY: "20k", CORES: "5e1"}) == ContainerGpuRequest(
        "engine", "share", gpus=1, memory_mib=20000, cores=50
    )
    assert only({GPU: "+2", "cpu": "1500m"}).gpus == 2
    assert only({VGPU: "1000m", MEMORY: "8Ki"}).memory_mib == 8192
    (request,) = parse_pod_request(
        pod(container(limits={VGPU: 1, MEMORY: "20k"}, requests={VGPU: 1, MEMORY: "20000"}))
    ).containers
    assert request.memory_mib == 20000


@pytest.mark.parametrize(
    ("quantity", "says"),
    [
        ("1.5", "not a whole number"),
        ("500m", "not a whole number"),
        ("1500m", "not a whole number"),
        (-1, "negative"),
        ("-1", "negative"),
        ("1e999999999", "above 9223372036854775807"),
        ("9" * 10_000, "characters long"),
        ("", "not a Kubernetes quantity"),
        ("²", "not a Kubernetes quantity"),
        (True, "expected a quantity"),
        (1.0, "expected a quantity"),
        (None, "expected a quantity"),
        ([1], "expected a quantity"),
    ],
)
def test_gpu_quantities_are_whole_numbers(quantity, says):
    with pytest.raises(ContractError, match=says) as raised:
        parse_pod_request(pod(container("engine-7", {GPU: quantity})))
    assert raised.value.field == f"{LIMITS}[{GPU}]"
    assert raised.value.reason.startswith("container 'engine-7': ")


def test_errors_name_the_right_container():
    with pytest.raises(ContractError) as raised:
        parse_pod_request(pod(container("ok", {GPU: 1}), container("bad", {VGPU: 3, MEMORY: 1})))
    assert raised.value.field == f"spec.containers[1].resources.limits[{VGPU}]"
    assert "'bad'" in raised.value.reason
    with pytest.raises(ContractError) as raised:
        parse_pod_request(pod(container(), init=(container("setup", {MEMORY: 1}),)))
    assert raised.value.field == f"spec.initContainers[0].resources.limits[{MEMORY}]"


@pytest.mark.parametrize(
    ("annotations", "field"),
    [
        (
            {"infergrid.io/placement-policy": "worstfit"},
            "metadata.annotations[infergrid.io/placement-policy]",
        ),
        (
            {"infergrid.io/placement-policy": ""},
            "metadata.annotations[infergrid.io/placement-policy]",
        ),
        ({"infergrid.io/topology": "pcie"}, "metadata.annotations[infergrid.io/topology]"),
        ({"infergrid.io/topology": 1}, "metadata.annotations[infergrid.io/topology]"),
        (
            {"infergrid.io/min-compute-capability": "8"},
            "metadata.annotations[infergrid.io/min-compute-capability]",
        ),
    ],
)
def test_bad_annotations_are_refused(annotations, field):
    with pytest.raises(ContractError) as raised:
        parse_pod_request(pod(container(), annotations=annotations))
    assert raised.value.field == field


@pytest.mark.parametrize(
    ("bad_pod", "field"),
    [
        ([], "pod"),
        ({}, "spec"),
        ({"spec": {}}, "spec.containers"),
        ({"spec": {"containers": [{}]}}, "spec.containers[0].name"),
        ({"spec": {"containers": ["engine"]}}, "spec.containers[0]"),
        (
            {"spec": {"containers": [{"name": "c", "resources": []}]}},
            "spec.containers[0].resources",
        ),
        ({"spec": {"containers": [{"name": "c", "resources": {"limits": 1}}]}}, LIMITS),
        ({"metadata": [], "spec": {"containers": []}}, "metadata"),
    ],
)
def test_malformed_pods_are_refused_naming_the_field(bad_pod, field):
    with pytest.raises(ContractError) as raised:
        parse_pod_request(bad_pod)
    assert raised.value.field == field


def test_null_sections_read_as_absent():
    bare = {
        "metadata": {"annotations": None},
        "spec": {"containers": [{"name": "c", "resources": None}]},
    }
    assert parse_pod_request(bare).containers == (ContainerGpuRequest("c", "none"),)
