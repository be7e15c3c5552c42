"""GPU-model constraints from an InferenceService to the GPU: deploy/samples/scheduling/
gpu-models.yaml applied through the operator, whose node affinity keeps the pods off nodes
of other models, and the extender, which on a node mixing models gives them only its A100.
A service asking for a model no GPU has waits, and its status names what was asked for
and what was found."""

from __future__ import annotations

import uuid

import pytest
import yaml
from kubernetes import client

from e2e.cluster.processes import wait_until
from e2e.extender_support import assigned_gpus, idle_nodes
from e2e.operator_support import (
    POOL_LABEL,
    SAMPLES,
    all_bound,
    condition,
    create_service,
    in_pool,
)
from infergrid.inventory import decode_inventory

pytestmark = pytest.mark.e2e

SAMPLE = SAMPLES / "scheduling" / "gpu-models.yaml"
L4 = {"model": "NVIDIA L4", "count": 2, "memoryMiB": 23034, "smCount": 58,
      "computeCapability": "8.9"}  # fmt: skip
A100 = {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "sm_count": 108,
        "compute_capability": "8.0"}  # fmt: skip


@pytest.fixture()
def pool(cluster):
    """Two KWOK nodes only this test's pods use: one of L4s, one with an A100 as GPU 1."""
    suffix = uuid.uuid4().hex[:6]
    entries = [{"name": f"models-{suffix}", "gpus": L4}]
    with idle_nodes(cluster.api, entries, {POOL_LABEL: suffix}) as plain:
        mixed = [{"name": f"mixed-{suffix}", "gpus": L4}]
        with idle_nodes(cluster.api, mixed, {POOL_LABEL: suffix}, gpu_changes={1: A100}) as names:
            yield suffix, plain[0], names[0]


def test_the_samples_pods_get_only_the_a100_of_the_mixed_node(
    cluster, namespace, start_operator, pool
):
    suffix, _, mixed = pool
    start_operator()
    core = client.CoreV1Api(cluster.api)
    body = in_pool(yaml.safe_load(SAMPLE.read_text()), suffix)
    create_service(cluster.api, namespace, body)
    name, replicas = body["metadata"]["name"], body["spec"]["replicas"]

    wait_until(
        lambda: all_bound(cluster.api, namespace, name, replicas),
        120,
        f"{replicas} pods of {name} bound",
    )
    inventory = decode_inventory(
        core.read_node(mixed).metadata.annotations["infergrid.io/gpu-inventory"]
    )
    a100 = next(g.uuid for g in inventory.gpus if g.model == A100["model"])
    assert assigned_gpus(core, namespace) == [(mixed, a100)] * replicas
    labels = core.read_node(mixed).metadata.labels
    assert (labels["infergrid.io/gpu.model"], labels["infergrid.io/gpu.mixed"]) == (
        "l4-24gb",
        "true",
    )


def test_a_model_no_gpu_has_waits_and_the_status_names_asked_and_found(
    cluster, namespace, start_operator, pool
):
    suffix, _, _ = pool
    start_operator()
    body = in_pool(yaml.safe_load(SAMPLE.read_text()), suffix)
    body["metadata"]["name"] = "wants-h100"
    body["spec"]["resources"]["gpuModels"] = ["h100-80gb"]
    body["spec"]["replicas"] = 1
    create_service(cluster.api, namespace, body)

    def reason() -> str:
        found = condition(cluster.api, namespace, "wants-h100", "Scheduled")
        return found.get("message", "") if found.get("status") == "False" else ""

    wait_until(reason, 120, "the Scheduled condition with the scheduler's reason")
    message = reason()
    assert "GPU model h100-80gb asked for, found NVIDIA L4 (l4-24gb)" in message, message
    assert "found NVIDIA A100-SXM4-80GB (a100-80gb)" in message, message
