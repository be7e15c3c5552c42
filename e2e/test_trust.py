"""DESIGN.md's trust model, attacked through the API server with real tokens.

A tenant who may create pods, Bindings and ephemeral containers in one namespace
(a ServiceAccount with exactly those rights, its token from the TokenRequest API)
tries each way around the extender's say over GPUs; the chart's components' own
tokens try to step outside what they write. Every attack must be refused with a
message that names what was refused, and must change nothing: the objects it
aimed at keep their resourceVersion.

The attacks that need running containers (the extender's listeners, the device
list a container gets, a device plugin restart) run on the real node, in
test_helm.py and test_real_node.py; the operator's, in test_operator.py. docs/security.md
lists them all.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from e2e.helm_release import Release, as_token, forbidden, gpu_nodes, tenant_api, token
from infergrid.assignment_annotation import (
    AssignedGpu,
    ContainerAssignment,
    PodAssignment,
    encode_assignment,
)
from infergrid.constants import ANNOTATION_GPU_ASSIGNMENT

pytestmark = pytest.mark.e2e

TENANT = "tenant"
DEVICES = "/var/run/nvidia-container-devices"  # where the NVIDIA runtime reads device lists
# What a tenant gets in its own namespace: pods (with ephemeral containers) and Bindings,
# more than most clusters give, so the policies and not RBAC are what refuse.
TENANT_RULES = [
    {"apiGroups": [""], "resources": ["pods"],
     "verbs": ["create", "get", "list", "patch", "update", "delete"]},
    {"apiGroups": [""], "resources": ["pods/ephemeralcontainers"], "verbs": ["patch", "update"]},
    {"apiGroups": [""], "resources": ["pods/binding", "bindings"], "verbs": ["create"]},
]  # fmt: skip


@pytest.fixture(scope="module")
def tenant(cluster, release: Release) -> Iterator[client.CoreV1Api]:
    """The tenant's API, under its own ServiceAccount token, in the release's served namespace."""
    ns = release.served
    yield client.CoreV1Api(tenant_api(cluster, ns, TENANT_RULES, TENANT))
    core, rbac = client.CoreV1Api(cluster.api), client.RbacAuthorizationV1Api(cluster.api)
    rbac.delete_namespaced_role_binding(TENANT, ns)
    rbac.delete_namespaced_role(TENANT, ns)
    core.delete_namespaced_service_account(TENANT, ns)


def pod(name: str, env: list[dict] | None = None, **spec: object) -> dict:
    """A pod no scheduler places (its scheduler does not exist): it stays as created."""
    container = {"name": "app", "image": "infergrid/pause", "env": env or []}
    return {
        "metadata": {"name": name},
        "spec": {"schedulerName": "nobody", "containers": [container], **spec},
    }


def names(core: client.CoreV1Api, namespace: str) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(namespace).items}


def unchanged(core: client.CoreV1Api, namespace: str, name: str, version: str) -> None:
    now = core.read_namespaced_pod(name, namespace)
    assert now.metadata.resource_version == version, f"{name} changed"


# --- 1: GPU access by environment variable or device-list mount ----------------------


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (pod("env", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
         "spec.containers[app].env[NVIDIA_VISIBLE_DEVICES]"),
        (pod("caps", [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}]),
         "spec.containers[app].env[NVIDIA_DRIVER_CAPABILITIES]"),
        (pod("mps", initContainers=[{
            "name": "init", "image": "infergrid/pause",
            "env": [{"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=80G"}]}]),
         "spec.initContainers[init].env[CUDA_MPS_PINNED_DEVICE_MEM_LIMIT]"),
        (pod("share", [{"name": "INFERGRID_GPU_MEMORY_MIB", "value": "81920"}]),
         "spec.containers[app].env[INFERGRID_GPU_MEMORY_MIB]"),
        (pod("imex", [{"name": "NVIDIA_IMEX_CHANNELS", "value": "all"}]),
         "spec.containers[app].env[NVIDIA_IMEX_CHANNELS]"),
        (pod("require", [{"name": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=99"},
                         {"name": "NVIDIA_DISABLE_REQUIRE", "value": "true"}]),
         "spec.containers[app].env[NVIDIA_DISABLE_REQUIRE]"),
        (pod("mount", volumes=[{"name": "v", "emptyDir": {}}], containers=[{
            "name": "app", "image": "infergrid/pause",
            "volumeMounts": [{"name": "v", "mountPath": f"{DEVICES}/all"}]}]),
         f"spec.containers[app].volumeMounts[{DEVICES}/all]"),
        (pod("as-plugin", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                               serviceAccountName="{plugin}"),
         "spec.containers[app].env[NVIDIA_VISIBLE_DEVICES]"),
    ],
    ids=["env", "capabilities", "mps", "share", "imex", "require", "mount", "plugin-account"],
)  # fmt: skip
def test_1_a_pod_cannot_give_itself_gpus_by_env_or_device_list_mount(
    cluster, release, tenant, body, named
):
    """Each reserved name or device-list mount is refused at create, naming its field; the
    device plugin's exemption holds only in the release's namespace, not by account name."""
    ns = release.served
    if body["spec"].get("serviceAccountName") == "{plugin}":
        # An account of the plugin's name, made in the tenant's namespace.
        body["spec"]["serviceAccountName"] = release.sa("device-plugin")
        account = {"metadata": {"name": release.sa("device-plugin")}}
        client.CoreV1Api(cluster.api).create_namespaced_service_account(ns, account)
    before = names(tenant, ns)
    message = forbidden(lambda: tenant.create_namespaced_pod(ns, body))
    assert named in message and "device plugin" in message
    assert names(tenant, ns) == before


def test_1_an_ephemeral_container_cannot_add_the_env_later(cluster, release, tenant):
    ns = release.served
    name = f"debug-{uuid.uuid4().hex[:5]}"
    created = tenant.create_namespaced_pod(ns, pod(name))  # the same pod, clean, is allowed
    debug = {"name": "dbg", "image": "infergrid/pause",
             "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}  # fmt: skip
    patch = {"spec": {"ephemeralContainers": [debug]}}
    message = forbidden(lambda: tenant.patch_namespaced_pod_ephemeralcontainers(name, ns, patch))
    assert "spec.ephemeralContainers[dbg].env[NVIDIA_VISIBLE_DEVICES]" in message
    unchanged(tenant, ns, name, created.metadata.resource_version)
    tenant.delete_namespaced_pod(name, ns, grace_period_seconds=0)


def test_1_the_device_plugin_pods_keep_their_own_env(cluster, release):
    """The component the policy exempts runs: its DaemonSet's pods, created by the
    DaemonSet controller, carry NVIDIA_VISIBLE_DEVICES=all."""
    apps = client.AppsV1Api(cluster.api)
    ds = apps.read_namespaced_daemon_set(release.sa("device-plugin"), release.namespace)
    assert ds.status.number_ready == len(gpu_nodes(cluster)) > 0
    env = {e.name: e.value for e in ds.spec.template.spec.containers[0].env}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"


# --- 2: a forged assignment through a Binding ----------------------------------------


def forged(node: str) -> str:
    gpu = AssignedGpu(uuid="GPU-00000000-0000-0000-0000-000000000001", memory_mib=81920, cores=0)
    container = ContainerAssignment(name="app", gpus=(gpu,), shared=False)
    return encode_assignment(PodAssignment(node, datetime.now(UTC), (container,)))


@pytest.mark.parametrize("path", ["pods/binding", "bindings"])
def test_2_a_binding_cannot_carry_an_assignment(cluster, release, tenant, path):
    """The API server copies a Binding's annotations onto the pod without pod admission:
    the assignment policy covers both ways to create one."""
    ns, node = release.served, sorted(gpu_nodes(cluster))[0]
    name = f"bind-{uuid.uuid4().hex[:5]}"
    created = tenant.create_namespaced_pod(ns, pod(name))
    binding = {
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "annotations": {ANNOTATION_GPU_ASSIGNMENT: forged(node)}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }  # fmt: skip
    if path == "bindings":
        create = lambda: tenant.create_namespaced_binding(ns, binding)  # noqa: E731
    else:
        create = lambda: tenant.create_namespaced_pod_binding(name, ns, binding)  # noqa: E731
    message = forbidden(create)
    assert ANNOTATION_GPU_ASSIGNMENT in message and release.user("extender") in message
    unchanged(tenant, ns, name, created.metadata.resource_version)
    assert not tenant.read_namespaced_pod(name, ns).spec.node_name
    tenant.delete_namespaced_pod(name, ns, grace_period_seconds=0)


def test_2_kube_scheduler_holds_no_long_lived_token(cluster, release):
    """No ServiceAccount token Secret in the release: kube-scheduler's token is minted by
    the extender with the TokenRequest API, bound to the pod, and expires."""
    core = client.CoreV1Api(cluster.api)
    secrets = core.list_namespaced_secret(release.namespace).items
    assert not [s.metadata.name for s in secrets if s.type == "kubernetes.io/service-account-token"]
    apps = client.AppsV1Api(cluster.api)
    spec = apps.read_namespaced_deployment(release.sa("scheduler"), release.namespace).spec
    volumes = {v.name: v for v in spec.template.spec.volumes}
    assert volumes["scheduler-token"].empty_dir is not None
    assert all(v.secret is None for v in volumes.values())


# --- 7: the extender's account is confined to the assignment -------------------------


def test_7_the_extender_may_write_the_assignment_and_nothing_else(cluster, release):
    ns, core = release.served, client.CoreV1Api(cluster.api)
    node = sorted(gpu_nodes(cluster))[0]
    name = f"victim-{uuid.uuid4().hex[:5]}"
    core.create_namespaced_pod(ns, pod(name))
    extender = client.CoreV1Api(
        as_token(cluster, token(cluster, release.namespace, release.sa("extender")))
    )
    version = core.read_namespaced_pod(name, ns).metadata.resource_version
    attacks = {
        "a label": {"metadata": {"labels": {"hijack": "yes"}}},
        "another annotation": {"metadata": {"annotations": {"team": "x"}}},
        "the spec": {"spec": {"activeDeadlineSeconds": 5}},
        "a finalizer": {"metadata": {"finalizers": ["example.com/hold"]}},
    }
    attacks["the assignment itself"] = {"metadata": {"annotations": {
        ANNOTATION_GPU_ASSIGNMENT: forged(node)}}}  # fmt: skip
    for what, patch in attacks.items():  # it binds with the assignment, and never patches
        message = forbidden(lambda p=patch: extender.patch_namespaced_pod(name, ns, p))
        assert "cannot patch resource" in message, what
    unchanged(core, ns, name, version)
    assignment = {ANNOTATION_GPU_ASSIGNMENT: forged(node)}
    for what, meta in {
        "a label": {"labels": {"x": "y"}},
        "another annotation": {"annotations": {"team": "x"}},
        "another annotation beside the assignment": {"annotations": {**assignment, "team": "x"}},
    }.items():
        bad = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, **meta},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
        message = forbidden(lambda b=bad: extender.create_namespaced_pod_binding(name, ns, b))
        assert "Bindings without labels whose only annotation is" in message, what
        assert ANNOTATION_GPU_ASSIGNMENT in message, what
    unchanged(core, ns, name, version)
    # What it is there for still works: one Binding that carries the assignment, with the
    # pod's uid and resourceVersion as preconditions, as scheduler_extender/binder.py sends.
    uid = core.read_namespaced_pod(name, ns).metadata.uid
    stale = {"apiVersion": "v1", "kind": "Binding",
             "metadata": {"name": name, "uid": uid, "resourceVersion": "1",
                          "annotations": assignment},
             "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
    with pytest.raises(ApiException) as conflict:
        extender.create_namespaced_pod_binding(name, ns, stale, _preload_content=False)
    assert conflict.value.status == 409  # the API server honours the resourceVersion
    unchanged(core, ns, name, version)
    binding = copy.deepcopy(stale)
    binding["metadata"]["resourceVersion"] = version
    extender.create_namespaced_pod_binding(name, ns, binding, _preload_content=False)
    bound = core.read_namespaced_pod(name, ns)
    assert bound.spec.node_name == node  # one write: bound, and carrying the assignment
    assert (
        bound.metadata.annotations[ANNOTATION_GPU_ASSIGNMENT]
        == assignment[ANNOTATION_GPU_ASSIGNMENT]
    )
    try:
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    except ApiException:
        pass
