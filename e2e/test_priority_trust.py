"""Cross-tenant eviction by PriorityClass, attacked through the chart install with real tokens.

A PriorityClass decides whom kube-scheduler and the extender evict, and RBAC cannot limit
which class a pod names. So a tenant's `bully` pod naming the online class where its
namespace's tier does not list it is refused at admission (the chart's pod-priority policy),
whoever creates it; and where the class is allowed, the chart's extender still evicts only
GPU holders of a preemptible class (by default the offline one), never another tenant's pods
that did not agree to it. Each attack changes nothing: the would-be victims keep their
resourceVersion.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from e2e.cluster.processes import wait_until
from e2e.extender_support import gpu_pod, share_pod
from e2e.helm_release import (
    CHART_SCHEDULER,
    E2E_LABEL,
    TIER_LABEL,
    Release,
    as_token,
    forbidden,
    helm,
    install_on_real_node,
    tenant_api,
    token,
)
from e2e.test_preemption import OFFLINE, ONLINE, four_gpus, only_on  # noqa: F401 - a fixture
from e2e.test_trust import TENANT, TENANT_RULES
from infergrid import constants

pytestmark = pytest.mark.e2e

BULLY = "bully"


def versions(core: client.CoreV1Api, namespace: str) -> dict[str, str]:
    """Every pod of the namespace, by name, with its resourceVersion."""
    pods = core.list_namespaced_pod(namespace).items
    return {p.metadata.name: p.metadata.resource_version for p in pods}


def parked(name: str, priority_class: str = "") -> dict:
    """A pod no scheduler places (its scheduler does not exist), of `priority_class`."""
    spec: dict = {"schedulerName": "nobody",
                  "containers": [{"name": "app", "image": "infergrid/pause"}]}  # fmt: skip
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"metadata": {"name": name}, "spec": spec}


# --- admission: the class a pod may name ----------------------------------------------


@pytest.fixture(scope="module")
def tenants(cluster, priority_classes, release: Release, namespaces) -> Iterator[dict]:
    """Under the release's policies: team-a (no tier), its tenant's API, and team-b (tier
    offline) with two parked pods of the offline class, the would-be victims."""
    scope = {E2E_LABEL: release.name}
    team_a = namespaces(labels=scope)
    team_b = namespaces(labels=scope | {TIER_LABEL: "offline"})
    core = client.CoreV1Api(cluster.api)
    for i in range(2):
        core.create_namespaced_pod(team_b, parked(f"batch-{i}", OFFLINE))
    tenant = client.CoreV1Api(tenant_api(cluster, team_a, TENANT_RULES, TENANT))
    yield {"team-a": team_a, "team-b": team_b, "tenant": tenant}


@pytest.mark.parametrize("klass", [ONLINE, OFFLINE, "system-cluster-critical"])
def test_a_tenants_bully_pod_naming_a_class_its_namespace_has_not_is_refused(
    cluster, tenants, klass
):
    core, team_a, team_b = client.CoreV1Api(cluster.api), tenants["team-a"], tenants["team-b"]
    victims = versions(core, team_b)
    message = forbidden(
        lambda: tenants["tenant"].create_namespaced_pod(team_a, parked(BULLY, klass))
    )
    assert "spec.priorityClassName" in message and klass in message, message
    assert team_a in message and "admissionPolicy.podPriorityClasses" in message, message
    if not klass.startswith("system-"):
        assert TIER_LABEL in message, message  # what the cluster admin would set
    assert BULLY not in versions(core, team_a)
    assert versions(core, team_b) == victims


def test_the_tenant_cannot_give_its_own_namespace_a_tier(cluster, tenants):
    """The tier is the cluster admin's to give: a tenant who could label its namespace
    could name any class."""
    namespace = tenants["team-a"]
    before = client.CoreV1Api(cluster.api).read_namespace(namespace).metadata.resource_version
    patch = {"metadata": {"labels": {TIER_LABEL: "online"}}}
    forbidden(lambda: tenants["tenant"].patch_namespace(namespace, patch))
    after = client.CoreV1Api(cluster.api).read_namespace(namespace).metadata.resource_version
    assert after == before


def test_a_pod_naming_no_class_or_one_its_tier_lists_is_admitted(cluster, tenants):
    core, team_b = client.CoreV1Api(cluster.api), tenants["team-b"]
    core.create_namespaced_pod(team_b, parked("plain"))
    core.create_namespaced_pod(team_b, parked("batch-more", OFFLINE))
    message = forbidden(lambda: core.create_namespaced_pod(team_b, parked(BULLY, ONLINE)))
    assert ONLINE in message and "offline" in message  # its tier, named
    assert {"plain", "batch-more"} <= set(versions(core, team_b))


def test_the_policy_holds_for_pods_a_controller_creates(cluster, tenants):
    """A Deployment's pods are created by the ReplicaSet controller under its own identity:
    the policy is on the pod, so they are refused too, and the ReplicaSet says why."""
    apps, team_a = client.AppsV1Api(cluster.api), tenants["team-a"]
    labels = {"app": BULLY}
    spec = parked(BULLY, ONLINE)["spec"]
    apps.create_namespaced_deployment(team_a, {
        "metadata": {"name": BULLY},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": spec}}})  # fmt: skip

    def failure() -> str:
        for rs in apps.list_namespaced_replica_set(team_a).items:
            for c in rs.status.conditions or []:
                if c.type == "ReplicaFailure" and ONLINE in (c.message or ""):
                    return c.message
        return ""

    wait_until(failure, 60, "the ReplicaSet to report the refused pod")
    assert "spec.priorityClassName" in failure()
    assert BULLY not in {n.split("-")[0] for n in versions(client.CoreV1Api(cluster.api), team_a)}


# --- the chart's extender: whom a bully of an allowed class may evict ------------------


@pytest.fixture(scope="module")
def chart(cluster, helm_ready, namespaces, infsvc_crd, priority_classes) -> Iterator[Release]:
    """The chart with its extender in a pod on the real node (as test_preemption.py has it),
    its preemption at the defaults: only the offline class is preemptible."""
    if not cluster.local:
        pytest.skip("installs the images built here on the local cluster's real node")
    rel = install_on_real_node(cluster, namespaces, "--set", "devicePlugin.enabled=false",
                               "--set", "gateway.enabled=false",
                               "--set", "operator.enabled=false")  # fmt: skip
    yield rel
    helm(cluster, "uninstall", rel.name, "--namespace", rel.namespace, "--wait")


def test_a_bully_of_an_allowed_class_evicts_no_gpu_pod_outside_the_preemptible_classes(
    cluster, chart, namespaces, request
):
    """team-b fills every GPU with classless shares; team-a, whose tier allows the online
    class, asks for a whole GPU. Before, the extender evicted two shares of one GPU for it;
    now nobody: the bully waits, refused, and team-b's pods keep their resourceVersion."""
    core, scope = client.CoreV1Api(cluster.api), {E2E_LABEL: chart.name}
    nodes = request.getfixturevalue("four_gpus")  # test_preemption.py's, imported
    team_a = namespaces(labels=scope | {TIER_LABEL: "online"})
    team_b = namespaces(labels=scope)
    for i in range(8):  # two 12 GiB shares on each 24 GiB GPU
        share = share_pod(f"share-{i}", 12288)
        share["spec"] = only_on(share["spec"], nodes) | {"schedulerName": CHART_SCHEDULER}
        core.create_namespaced_pod(team_b, share)

    def settled() -> int:
        """Bound and Ready: KWOK writes each pod's status once more after its bind, and a
        version read before that would change with no eviction."""
        return sum(1 for p in core.list_namespaced_pod(team_b).items if p.spec.node_name
                   and any(c.type == "Ready" and c.status == "True"
                           for c in p.status.conditions or []))  # fmt: skip

    wait_until(lambda: settled() == 8, 120, "team-b's eight shares bound, two per GPU, Ready")
    victims = versions(core, team_b)

    bully = gpu_pod(BULLY, {constants.RESOURCE_GPU: "1"})
    bully["spec"] = only_on(bully["spec"], nodes) | {
        "schedulerName": CHART_SCHEDULER, "priorityClassName": ONLINE}  # fmt: skip
    tenant = client.CoreV1Api(tenant_api(cluster, team_a, TENANT_RULES, TENANT))
    tenant.create_namespaced_pod(team_a, bully)

    def reasons() -> list[str]:
        events = core.list_namespaced_event(team_a, field_selector=f"involvedObject.name={BULLY}")
        return [e.reason for e in events.items]

    # kube-scheduler records FailedScheduling after the extender's filter (where it plans
    # and starts its evictions) and its preempt verb have both answered.
    wait_until(lambda: "FailedScheduling" in reasons(), 120, "the bully refused by every node")
    assert "Preempting" not in reasons() and "PreemptionGivenUp" not in reasons()
    assert not core.read_namespaced_pod(BULLY, team_a).spec.node_name
    assert versions(core, team_b) == victims
    events = core.list_namespaced_event(team_b).items
    assert "Preempted" not in {e.reason for e in events}


def test_the_extenders_evictions_must_name_the_pod_uid(cluster, release: Release, tenants):
    """Its RBAC may create pods/eviction, and its policy covers that too; but the API server
    shows a policy only the Eviction, not the pod, so the uid is all it can hold the
    extender to (the extender's own preemptibleClasses choose whom)."""
    core, team_b = client.CoreV1Api(cluster.api), tenants["team-b"]
    victims = versions(core, team_b)
    extender = client.CoreV1Api(
        as_token(cluster, token(cluster, release.namespace, release.sa("extender")))
    )
    body = {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": "batch-0", "namespace": team_b}}  # fmt: skip
    message = forbidden(lambda: extender.create_namespaced_pod_eviction("batch-0", team_b, body))
    assert "evict a pod by its uid" in message and "pods/eviction" in message, message
    assert versions(core, team_b) == victims
