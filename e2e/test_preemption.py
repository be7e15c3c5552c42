"""Preemption that sees GPU shares, through the real kube-scheduler and the extender: an online
pod that finds every GPU filled by offline shares evicts exactly the offline pods of one GPU,
binds there, and the evicted work waits, Pending, without preempting back. kube-scheduler's
own dry run counts no GPU memory, so here the extender leads (scheduler_extender/preemptor.py).

The first test runs the extender as a process with the chart's extender token; the second
runs the chart itself, its operator and extender in pods on the real node."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client

from e2e.cluster.processes import wait_until
from e2e.extender_support import assigned_gpus, gpu_pod, idle_nodes, share_pod
from e2e.helm_release import (
    CHART_CLASSES,
    CHART_SCHEDULER,
    Release,
    give_tier,
    helm,
    install_on_real_node,
)
from e2e.operator_support import POOL_LABEL, SAMPLES, create_service, in_pool, owned
from infergrid import constants
from infergrid.assignment_annotation import decode_assignment

pytestmark = pytest.mark.e2e

ONLINE, OFFLINE = CHART_CLASSES["online"]["name"], CHART_CLASSES["offline"]["name"]


SAMPLE = SAMPLES / "scheduling" / "online-offline.yaml"


@pytest.fixture()
def four_gpus(cluster):
    """Two KWOK nodes with two idle 24 GiB GPUs each, that only this test's pods may use
    (by name, or by the pool label they carry: the node names' suffix)."""
    gpus = {"model": "NVIDIA A10", "count": 2, "memoryMiB": 24576, "smCount": 72,
            "computeCapability": "8.6"}  # fmt: skip
    suffix = uuid.uuid4().hex[:6]
    entries = [{"name": f"pre{i}-{suffix}", "gpus": gpus} for i in range(2)]
    with idle_nodes(cluster.api, entries, {POOL_LABEL: suffix}) as names:
        yield names


def only_on(pod_spec: dict, nodes: list[str]) -> dict:
    term = {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}
    pod_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [term]}]}}}  # fmt: skip
    return pod_spec


def test_an_online_pod_evicts_the_offline_shares_of_one_gpu_and_they_wait(
    cluster, namespace, extender, priority_classes, four_gpus
):
    core, apps = client.CoreV1Api(cluster.api), client.AppsV1Api(cluster.api)
    give_tier(cluster.api, namespace)
    offline = share_pod("batch", 12288)
    spec = only_on(offline["spec"], four_gpus) | {"priorityClassName": OFFLINE}
    labels = {"app": "batch"}
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "batch"},
        "spec": {"replicas": 8, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": spec}}})  # fmt: skip

    def batch_pods(bound: bool) -> list[client.V1Pod]:
        pods = core.list_namespaced_pod(namespace, label_selector="app=batch").items
        return [
            p for p in pods if bool(p.spec.node_name) == bound and not p.metadata.deletion_timestamp
        ]

    wait_until(lambda: len(batch_pods(True)) == 8, 120, "8 offline shares bound, 2 per GPU")
    before = {p.metadata.name: p for p in batch_pods(True)}

    online = gpu_pod("online", {constants.RESOURCE_GPU: "1"})
    online["spec"] = only_on(online["spec"], four_gpus) | {"priorityClassName": ONLINE}
    core.create_namespaced_pod(namespace, online)
    wait_until(lambda: core.read_namespaced_pod("online", namespace).spec.node_name,
               120, "the online pod bound after preemption")  # fmt: skip

    ((node, gpu),) = assigned_gpus(core, namespace, ["online"])
    survivors = {p.metadata.name for p in batch_pods(True)}
    evicted = set(before) - survivors
    assert len(evicted) == 2, f"evicted {sorted(evicted)}"
    for name in evicted:  # exactly the two shares of the GPU the online pod took
        assert assigned_gpus_of(before[name]) == [(node, gpu)]
        assert "Preempted" in event_reasons(core, namespace, name)
    assert "Preempting" in event_reasons(core, namespace, "online")
    # Their Deployment made them again; they wait, and offline never preempts.
    wait_until(lambda: len(batch_pods(False)) == 2, 60, "two offline replicas Pending")
    assert len(batch_pods(True)) == 6
    assert core.read_namespaced_pod("online", namespace).spec.node_name == node


def event_reasons(core: client.CoreV1Api, namespace: str, name: str) -> set[str]:
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return {e.reason for e in events.items}


def assigned_gpus_of(pod: client.V1Pod) -> list[tuple[str, str]]:
    text = pod.metadata.annotations[constants.ANNOTATION_GPU_ASSIGNMENT]
    assignment = decode_assignment(text)
    return [(assignment.node, g.uuid) for c in assignment.containers for g in c.gpus]


@pytest.fixture(scope="module")
def chart(cluster, helm_ready, namespaces, infsvc_crd, priority_classes) -> Iterator[Release]:
    """The chart installed as users install it, its components in pods on the real node: the
    operator, and infergrid-scheduler with the extender, each with only the rights the
    chart gives it, under its own admission policies. The cluster's own device plugin keeps
    the real node; the pods here go to KWOK nodes."""
    if not cluster.local:
        pytest.skip("installs the images built here on the local cluster's real node")
    rel = install_on_real_node(cluster, namespaces, "--set", "devicePlugin.enabled=false",
                               "--set", "gateway.enabled=false")  # fmt: skip
    give_tier(cluster.api, rel.served)
    yield rel
    helm(cluster, "uninstall", rel.name, "--namespace", rel.namespace, "--wait")


def test_the_charts_extender_evicts_two_offline_replicas_past_their_budget_and_stops(
    cluster, chart, four_gpus
):
    """deploy/samples/scheduling/online-offline.yaml through the installed operator and
    extender. The offline service's own PodDisruptionBudget (maxUnavailable 1) lets the first
    eviction through and refuses the second, since the first victim's replacement stays
    Pending; the extender then deletes that pod, as kube-scheduler's preemption would, which
    the chart's admission policy allows it for GPU holders only. Two victims, one
    Preempting event: nothing loops."""
    namespace, core = chart.served, client.CoreV1Api(cluster.api)
    pool = four_gpus[0].rsplit("-", 1)[1]
    offline, online = (in_pool(doc, pool) for doc in yaml.safe_load_all(SAMPLE.read_text()))
    batch, chat = offline["metadata"]["name"], online["metadata"]["name"]
    create_service(cluster.api, namespace, offline)

    def pods(name: str, bound: bool) -> list[client.V1Pod]:
        return [p for p in owned(cluster.api, namespace, name)["Pod"]
                if bool(p.spec.node_name) == bound]  # fmt: skip

    replicas = offline["spec"]["replicas"]
    wait_until(lambda: len(pods(batch, True)) == replicas, 180, f"{replicas} offline shares bound")
    assert all(p.spec.scheduler_name == CHART_SCHEDULER for p in pods(batch, True))
    (budget,) = owned(cluster.api, namespace, batch)["PodDisruptionBudget"]
    assert budget.spec.max_unavailable == 1
    before = {p.metadata.name: p for p in pods(batch, True)}
    create_service(cluster.api, namespace, online)
    wait_until(lambda: pods(chat, True), 180, "the online replica bound after preemption")

    ((chat_pod,),) = [pods(chat, True)]
    ((node, gpu),) = assigned_gpus(core, namespace, [chat_pod.metadata.name])
    evicted = set(before) - {p.metadata.name for p in pods(batch, True)}
    assert len(evicted) == 2, f"evicted {sorted(evicted)}"
    assert all(assigned_gpus_of(before[name]) == [(node, gpu)] for name in evicted)
    wait_until(lambda: len(pods(batch, False)) == 2, 60, "two offline replicas Pending")
    assert len(pods(batch, True)) == replicas - 2
    reasons = all_event_reasons(core, namespace)
    assert reasons.count("Preempting") == 1 and reasons.count("Preempted") == 2, reasons
    assert "PreemptionGivenUp" not in reasons


def all_event_reasons(core: client.CoreV1Api, namespace: str) -> list[str]:
    return [e.reason for e in core.list_namespaced_event(namespace).items]
