"""What a pod asks of a node besides GPUs, as the extender learns it: Kubernetes' effective
request (containers and sidecars together, or the largest init step, plus overhead) and
the GPU models its node selection allows."""

import pytest

from infergrid.constants import LABEL_GPU_PRODUCT
from infergrid.errors import ContractError
from infergrid.placement import HostRequest
from infergrid.pod_host import parse_host_request


def container(cpu: str | None = None, memory: str | None = None, **extra: object) -> dict:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"name": "c", "resources": {"requests": requests}, **extra}


def pod(**spec: object) -> dict:
    return {"metadata": {"name": "p"}, "spec": {"containers": [container("1")], **spec}}


def test_containers_add_up_and_memory_reads_in_mib_rounded_up():
    spec = {"containers": [container("500m", "1Gi"), container("1.5", "1")]}
    assert parse_host_request({"spec": spec}) == HostRequest(2000, 1025)


def test_an_init_container_counts_only_when_it_needs_more_than_the_containers():
    spec = {"initContainers": [container("4")], "containers": [container("1")]}
    assert parse_host_request({"spec": spec}).cpu_milli == 4000
    spec = {"initContainers": [container("100m")], "containers": [container("1")]}
    assert parse_host_request({"spec": spec}).cpu_milli == 1000


def test_a_sidecar_runs_beside_the_containers_and_the_init_steps_after_it():
    sidecar = container("1", restartPolicy="Always")
    spec = {
        "initContainers": [sidecar, container("2")],
        "containers": [container("500m")],
        "overhead": {"cpu": "250m"},
    }
    # the init step runs with the sidecar (3 cores), above sidecar + containers (1.5)
    assert parse_host_request({"spec": spec}).cpu_milli == 3250


def test_a_pod_without_requests_asks_for_nothing():
    assert parse_host_request({"spec": {"containers": [{"name": "c"}]}}) == HostRequest()


def test_models_come_from_the_node_selector():
    request = parse_host_request(pod(nodeSelector={LABEL_GPU_PRODUCT: "NVIDIA-L4"}))
    assert request.gpu_models == {"NVIDIA-L4"}


def affinity(*terms: list[dict]) -> dict:
    required = {"nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def models_in(*values: str) -> dict:
    return {"key": LABEL_GPU_PRODUCT, "operator": "In", "values": list(values)}


def test_models_come_from_required_affinity_terms_which_are_ored():
    spec = affinity([models_in("A100")], [models_in("H100", "L4")])
    assert parse_host_request(pod(affinity=spec)).gpu_models == {"A100", "H100", "L4"}


def test_a_term_that_does_not_name_the_model_allows_any():
    other = {"key": "zone", "operator": "In", "values": ["a"]}
    spec = affinity([models_in("A100")], [other])
    assert parse_host_request(pod(affinity=spec)).gpu_models == frozenset()


def test_selector_and_affinity_together_allow_only_what_both_allow():
    spec = pod(nodeSelector={LABEL_GPU_PRODUCT: "L4"}, affinity=affinity([models_in("L4", "T4")]))
    assert parse_host_request(spec).gpu_models == {"L4"}


def test_a_bad_amount_names_its_field():
    spec = {"containers": [container("1")], "initContainers": [container("lots")]}
    with pytest.raises(ContractError) as err:
        parse_host_request({"spec": spec})
    assert err.value.field == "spec.initContainers[0].resources.requests.cpu"


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"nodeSelector": "x"}, "spec.nodeSelector"),
        ({"affinity": [1]}, "spec.affinity"),
        ({"affinity": {"nodeAffinity": 5}}, "spec.affinity.nodeAffinity"),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [7]}]}}}},
         "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
         ".nodeSelectorTerms[0].matchExpressions[0]"),
        ({"overhead": True}, "spec.overhead"),
        ({"initContainers": [1]}, "spec.initContainers[0]"),
        ({"containers": [{"resources": {"requests": ["cpu"]}}]},
         "spec.containers[0].resources.requests"),
    ],
)  # fmt: skip
def test_a_part_of_the_wrong_kind_is_refused_naming_it(spec, field):
    """The extender's fuzzer sent these to filter: each raised past every reader
    ("'int' object has no attribute 'get'"), answered as an internal error."""
    with pytest.raises(ContractError) as refused:
        parse_host_request({"spec": spec})
    assert refused.value.field == field
