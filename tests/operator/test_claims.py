"""GPUs by ResourceClaim: spec.resources.claims read with bad fields named, one template per
entry named collision-safe, and the pods that name them."""

from __future__ import annotations

import pytest

from inference_operator.claims import template_name
from inference_operator.configmap_gc import claim_templates_in_use
from inference_operator.render import engine_config, render_children, render_deployment
from inference_operator.spec import parse_spec
from infergrid import dra
from infergrid.errors import ContractError

MODEL = {"name": "m", "storageUri": "pkg://m"}
SHARE = {"name": "gpu", "kind": "share", "memory": "4Gi", "cores": 25}


def spec(*claims: dict, **resources: object):
    doc = {"model": MODEL, "resources": {"claims": list(claims), **resources}}
    return parse_spec(doc, "img:1", "infergrid-scheduler")


def templates(service) -> dict[str, dict]:
    children = render_children(service, "chat", "ns")
    return {c["metadata"]["name"]: c for c in children if c["kind"] == "ResourceClaimTemplate"}


def request(claim: dict) -> dict:
    (template,) = templates(spec(claim)).values()
    (only,) = template["spec"]["spec"]["devices"]["requests"]
    return only


def test_a_share_asks_its_class_for_memory_and_cores_as_capacity():
    assert request(SHARE) == {
        "name": "gpu",
        "exactly": {
            "deviceClassName": dra.CLASS_SHARE,
            "allocationMode": "ExactCount",
            "count": 1,
            "capacity": {"requests": {"memory": "4Gi", "cores": "25"}},
        },
    }


def test_a_share_without_cores_asks_for_memory_only():
    claim = {"name": "gpu", "kind": "share", "memory": "4Gi"}
    assert request(claim)["exactly"]["capacity"] == {"requests": {"memory": "4Gi"}}


def test_whole_gpus_are_counted_and_mig_selects_its_profile():
    assert request({"name": "g", "kind": "gpu", "count": 2})["exactly"] == {
        "deviceClassName": dra.CLASS_GPU, "allocationMode": "ExactCount", "count": 2,
    }  # fmt: skip
    mig = request({"name": "m", "kind": "mig", "migProfile": "3g.40gb"})["exactly"]
    assert (mig["deviceClassName"], mig["count"]) == (dra.CLASS_MIG, 1)
    expression = 'device.attributes["gpu.infergrid.io"].migProfile == "3g.40gb"'
    assert mig["selectors"] == [{"cel": {"expression": expression}}]


def test_the_pods_name_their_templates_and_the_engine_asks_for_the_marker():
    service = spec(SHARE, {"name": "whole", "kind": "gpu"}, cpu="2")
    pod = render_deployment(service, "chat", "ns")["spec"]["template"]["spec"]
    names = list(templates(service))
    assert pod["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": names[0]},
        {"name": "whole", "resourceClaimTemplateName": names[1]},
    ]
    (engine,) = pod["containers"]
    assert engine["resources"] == {
        "claims": [{"name": "gpu"}, {"name": "whole"}],
        "requests": {"cpu": "2", "infergrid.io/gpu-claim": "1"},
        "limits": {"infergrid.io/gpu-claim": "1"},
    }
    assert pod["schedulerName"] == "infergrid-scheduler"
    assert claim_templates_in_use([{"spec": {"template": {"spec": pod}}}], [], []) == set(names)


def test_templates_come_before_the_deployments_and_are_the_services():
    children = render_children(spec(SHARE), "chat", "ns")
    kinds = [c["kind"] for c in children]
    assert kinds.index("ResourceClaimTemplate") < kinds.index("Deployment")
    (template,) = templates(spec(SHARE)).values()
    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert template["metadata"]["namespace"] == "ns"
    assert template["metadata"]["labels"]["infergrid.io/inferenceservice"] == "chat"


def test_whole_gpus_claimed_are_the_engines_tensor_parallel_ranks():
    assert engine_config(spec({"name": "g", "kind": "gpu", "count": 2}), "stable")[
        "engine"
    ]["tensorParallelSize"] == 2  # fmt: skip
    assert engine_config(spec(SHARE), "stable")["engine"]["tensorParallelSize"] == 1


def test_a_template_name_is_a_dns_label_that_changes_with_the_claim_and_never_collides():
    """Its spec is immutable: a changed claim must be a new template."""
    service = spec(SHARE).resources.claims[0]
    bigger = spec({**SHARE, "memory": "8Gi"}).resources.claims[0]
    assert template_name("chat", service) != template_name("chat", bigger)
    ab_c = spec({**SHARE, "name": "c"}).resources.claims[0]
    a_bc = spec({**SHARE, "name": "b-c"}).resources.claims[0]
    assert template_name("a-b", ab_c) != template_name("a", a_bc)
    long = template_name("s" * 63, spec({**SHARE, "name": "c" * 63}).resources.claims[0])
    assert len(long) == 63 and long[0].isalpha() and "--" not in long


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        ({"gpus": 1, "claims": [SHARE]}, "spec.resources.claims"),
        ({"gpuMemoryMiB": 1024, "claims": [SHARE]}, "spec.resources.claims"),
        ({"claims": [SHARE], "gpuModels": ["a100-80gb"]}, "spec.resources.gpuModels"),
        ({"claims": [{"kind": "gpu"}]}, "spec.resources.claims[0].name"),
        ({"claims": [{"name": "Gpu", "kind": "gpu"}]}, "spec.resources.claims[0].name"),
        ({"claims": [{"name": "g"}]}, "spec.resources.claims[0].kind"),
        ({"claims": [{"name": "g", "kind": "tpu"}]}, "spec.resources.claims[0].kind"),
        ({"claims": [{"name": "g", "kind": "share"}]}, "spec.resources.claims[0].memory"),
        ({"claims": [{**SHARE, "memory": "lots"}]}, "spec.resources.claims[0].memory"),
        ({"claims": [{**SHARE, "memory": "0"}]}, "spec.resources.claims[0].memory"),
        ({"claims": [{**SHARE, "cores": 101}]}, "spec.resources.claims[0].cores"),
        ({"claims": [{**SHARE, "count": 2}]}, "spec.resources.claims[0].count"),
        ({"claims": [{"name": "g", "kind": "gpu", "count": 9}]}, "spec.resources.claims[0].count"),
        ({"claims": [{"name": "g", "kind": "gpu", "memory": "1Gi"}]},
         "spec.resources.claims[0].memory"),
        ({"claims": [{"name": "g", "kind": "mig"}]}, "spec.resources.claims[0].migProfile"),
        ({"claims": [{"name": "g", "kind": "mig", "migProfile": "3g"}]},
         "spec.resources.claims[0].migProfile"),
        ({"claims": [{"name": "g", "kind": "gpu", "size": 1}]}, "spec.resources.claims[0].size"),
        ({"claims": [SHARE, SHARE]}, "spec.resources.claims[1].name"),
        ({"claims": [{**SHARE, "name": f"g{i}"} for i in range(9)]}, "spec.resources.claims"),
    ],
)  # fmt: skip
def test_bad_claims_are_named(resources, field):
    with pytest.raises(ContractError) as err:
        parse_spec({"model": MODEL, "resources": resources}, "img:1", "infergrid-scheduler")
    assert err.value.field == field
