"""A release of the chart on the local cluster, and the tokens its components hold.

Shared by the chart's tests (test_helm.py), the attacks on the trust model
(test_trust.py), preemption through the installed chart (test_preemption.py) and the
suite's own release (identities.py): each installs its own release, whose admission
policies cover only namespaces labelled infergrid.io/helm-e2e=<release name>, so no two
releases' policies, each allowing only its own extender, cover the same namespace.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from e2e.cluster.fake_nodes import KWOK_TAINT
from e2e.cluster.local_cluster import DEFAULT_FLEET
from e2e.cluster.node_configs import REAL_NODE_LABEL
from e2e.cluster.node_images import LOCAL_VALUES, chart_args
from e2e.cluster.processes import wait_until
from images import cluster_binaries

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "infergrid"
VALUES = ROOT / "deploy" / "helm" / "values"
KWOK_VALUES = VALUES / "kwok-e2e.yaml"
HELM = cluster_binaries.paths()["helm"]
E2E_LABEL = "infergrid.io/helm-e2e"
SCOPE_KEY = E2E_LABEL.replace(".", "\\.")  # --set splits keys at unescaped dots
CPU_NODE = "helm-e2e-cpu"
INSTANCE = "app.kubernetes.io/instance"
# The chart's two PriorityClasses, as its values.yaml names them.
CHART_CLASSES = yaml.safe_load((CHART / "values.yaml").read_text())["priorityClasses"]
CLASS_NAMES = (CHART_CLASSES["online"]["name"], CHART_CLASSES["offline"]["name"])
# The namespace label whose value (a tier) says which of them its pods may name.
TIER_LABEL = yaml.safe_load((CHART / "values.yaml").read_text())["admissionPolicy"][
    "podPriorityClasses"
]["namespaceLabel"]


# --- commands -------------------------------------------------------------------------


def make_priority_classes(api: client.ApiClient) -> None:
    """The chart's two PriorityClasses, made as its template makes them, unless they exist.
    The suite's releases leave them to this (`priorityClasses.create: false` in its value
    sets): they are cluster-wide, and several releases run at once."""
    scheduling = client.SchedulingV1Api(api)
    for role, policy in (("online", "PreemptLowerPriority"), ("offline", "Never")):
        body = {"metadata": {"name": CHART_CLASSES[role]["name"]},
                "value": CHART_CLASSES[role]["value"], "preemptionPolicy": policy}  # fmt: skip
        try:
            scheduling.create_priority_class(body)
        except ApiException as err:
            if err.status != 409:
                raise


def give_tier(api: client.ApiClient, namespace: str, tier: str = "online") -> None:
    """What a cluster admin does for a namespace whose pods may name the chart's classes
    (the chart's pod-priority admission policy refuses them elsewhere)."""
    client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"labels": {TIER_LABEL: tier}}})


def run(
    argv: list[str], stdin: str | None = None, timeout: float = 240
) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )


def helm(cluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return run([str(HELM), "--kubeconfig", str(cluster.kubeconfig), *args], stdin)


def kubectl(cluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    binary = cluster_binaries.paths()["kubectl"]
    return run([str(binary), "--kubeconfig", str(cluster.kubeconfig), *args], stdin)


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, f"{' '.join(done.args[:4])}...: {done.stderr}{done.stdout}"
    return done.stdout


# --- fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm_ready(cluster) -> None:
    if not HELM.exists():
        pytest.skip(f"helm is not built ({HELM}); run `make cluster-build`")
    if not cluster_binaries.paths()["kubectl"].exists():
        pytest.skip("kubectl is not built; run `make cluster-build`")


@pytest.fixture(scope="module")
def namespaces(cluster) -> Iterator[Callable[..., str]]:
    """Makes namespaces (named, or fresh) for the module; deletes the ones it made."""
    core = client.CoreV1Api(cluster.api)
    made: list[str] = []

    def make(name: str | None = None, labels: dict | None = None) -> str:
        name = name or f"helm-{uuid.uuid4().hex[:6]}"
        try:
            core.create_namespace({"metadata": {"name": name, "labels": labels or {}}})
            made.append(name)
        except ApiException as err:
            if err.status != 409:
                raise
        wait_until(
            lambda: core.read_namespaced_service_account("default", name), 60, f"{name} ready"
        )
        return name

    yield make
    for name in made:
        try:
            core.delete_namespace(name)
        except ApiException:
            pass


@pytest.fixture(scope="module")
def cpu_node(cluster) -> Iterator[str]:
    """A KWOK node without GPUs for the operator and the scheduler (the fleet has none)."""
    if not cluster.local:
        pytest.skip("installs on KWOK nodes of the local cluster (the images are not built)")
    core = client.CoreV1Api(cluster.api)
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    labels = {
        "kubernetes.io/hostname": CPU_NODE,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "infergrid.io/e2e-node": "cpu",
    }
    body = {
        "metadata": {"name": CPU_NODE, "labels": labels,
                     "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"taints": [KWOK_TAINT]},
        "status": {"capacity": capacity, "allocatable": capacity},
    }  # fmt: skip
    try:
        core.create_node(body)
    except ApiException as err:
        if err.status != 409:
            raise

    def schedulable() -> bool:
        node = core.read_node(CPU_NODE)
        ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
        return ready and [t.key for t in node.spec.taints or []] == [KWOK_TAINT["key"]]

    wait_until(schedulable, 90, f"KWOK to make {CPU_NODE} Ready")
    yield CPU_NODE
    core.delete_node(CPU_NODE)


def gpu_nodes(cluster) -> set[str]:
    """The KWOK GPU nodes, where the e2e values put the device plugin."""
    selector = f"infergrid.io/gpu.count,!{REAL_NODE_LABEL}"
    nodes = client.CoreV1Api(cluster.api).list_node(label_selector=selector)
    return {n.metadata.name for n in nodes.items}


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str  # the release's
    served: str  # the one namespace its operator serves
    manifest: str

    @property
    def fullname(self) -> str:
        return f"{self.name}-infergrid"

    def sa(self, component: str) -> str:
        return f"{self.fullname}-{component}"

    def user(self, component: str) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.sa(component)}"


def install(
    cluster, namespaces, *extra: str, values: tuple[str, ...] = ("-f", str(KWOK_VALUES)),
    timeout: str = "180s",
) -> Release:  # fmt: skip
    """A release of the chart with the e2e values (or `values`); its policies cover only its
    own namespaces. Fails the test, after uninstalling, when the install does not come up.

    Two releases' policies would each allow only their own extender, so each
    release scopes its policies to namespaces labelled with its name.
    """
    name = f"ig{uuid.uuid4().hex[:5]}"
    label = {E2E_LABEL: name}
    ns, served = namespaces(labels=label), namespaces(labels=label)
    done = helm(
        cluster, "install", name, str(CHART), "--namespace", ns, *values,
        "--set", f"operator.watchNamespaces={{{served}}}",
        "--set", f"gateway.watchNamespaces={{{served}}}",
        "--set", f"admissionPolicy.namespaceSelector.matchLabels.{SCOPE_KEY}={name}",
        *extra, "--wait", "--timeout", timeout,
    )  # fmt: skip
    if done.returncode != 0:
        state = kubectl(cluster, "get", "pods,events", "-n", ns)
        helm(cluster, "uninstall", name, "--namespace", ns, "--wait")
        pytest.fail(f"helm install: {done.stderr}\n{state.stdout}")
    manifest = ok(helm(cluster, "get", "manifest", name, "--namespace", ns))
    return Release(name, ns, served, manifest)


CHART_SCHEDULER = "infergrid-chart"
"""The scheduler name of a release on the real node, beside the local cluster's own
infergrid-scheduler (which the suite's extender process serves)."""


def install_on_real_node(cluster, namespaces, *extra: str) -> Release:
    """A release whose components run in pods on the real node, from the images built here,
    as `helm install` with deploy/helm/values/local-cluster.yaml puts them; its scheduler is
    CHART_SCHEDULER, and its policies cover only its own namespaces."""
    return install(
        cluster, namespaces,
        "--set", f"schedulerName={CHART_SCHEDULER}", "--set", "priorityClasses.create=false",
        "--set", f"operator.allowedPriorityClasses={{{','.join(CLASS_NAMES)}}}", *extra,
        values=tuple(chart_args(LOCAL_VALUES, DEFAULT_FLEET)), timeout="300s",
    )  # fmt: skip


@pytest.fixture(scope="module")
def release(cluster, helm_ready, cpu_node, namespaces, infsvc_crd) -> Iterator[Release]:
    """One release for the RBAC, admission and component tests; uninstalled at the end."""
    rel = install(cluster, namespaces)
    yield rel
    helm(cluster, "uninstall", rel.name, "--namespace", rel.namespace, "--wait")


# --- tokens ---------------------------------------------------------------------------


def token(cluster, namespace: str, sa: str, pod: client.V1Pod | None = None) -> str:
    """A TokenRequest token, bound to `pod` as the kubelet's projected token is."""
    spec: dict = {"audiences": [], "expirationSeconds": 3600}
    if pod is not None:
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod",
                                  "name": pod.metadata.name, "uid": pod.metadata.uid}  # fmt: skip
    request = client.CoreV1Api(cluster.api).create_namespaced_service_account_token(
        sa, namespace, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": spec}
    )  # fmt: skip
    return request.status.token


def tenant_api(
    cluster, namespace: str, rules: list[dict], name: str = "tenant"
) -> client.ApiClient:
    """A tenant of `namespace`, as an attacker would be one: a ServiceAccount bound there to
    a Role of `rules`, and an API client holding its TokenRequest token, never the admin's.
    The account goes with its namespace."""
    core, rbac = client.CoreV1Api(cluster.api), client.RbacAuthorizationV1Api(cluster.api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
    rbac.create_namespaced_role_binding(
        namespace,
        {"metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    )  # fmt: skip
    tenant = as_token(cluster, token(cluster, namespace, name))
    wait_until(lambda: _granted(tenant, namespace, rules), 30, f"RBAC to grant {name} its Role")
    return tenant


def _granted(api: client.ApiClient, namespace: str, rules: list[dict]) -> bool:
    """Whether the API server authorizes every rule's every verb for `api`'s identity yet: a
    new RoleBinding takes effect once the server's RBAC cache has seen it, a moment later
    (seconds on a loaded machine)."""
    reviews = client.AuthorizationV1Api(api)
    for rule in rules:
        for group in rule.get("apiGroups", [""]):
            for name in rule["resources"]:
                resource, _, subresource = name.partition("/")
                for verb in rule["verbs"]:
                    attributes = {"namespace": namespace, "group": group, "resource": resource,
                                  "subresource": subresource, "verb": verb}  # fmt: skip
                    body = {"spec": {"resourceAttributes": attributes}}
                    if not reviews.create_self_subject_access_review(body).status.allowed:
                        return False
    return True


def as_token(cluster, bearer: str) -> client.ApiClient:
    admin = cluster.api.configuration
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert = admin.host, admin.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {bearer}"}
    return client.ApiClient(cfg)


def token_kubeconfig(cluster, bearer: str, path: Path) -> Path:
    admin = cluster.api.configuration
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": admin.host,
                            "certificate-authority": admin.ssl_ca_cert,
                        },
                    }
                ],
                "users": [{"name": "sa", "user": {"token": bearer}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "sa"}}],
                "current-context": "c",
            }  # fmt: skip
        )
    )
    return path


def component_pods(cluster, rel: Release, component: str) -> list[client.V1Pod]:
    selector = f"{INSTANCE}={rel.name},app.kubernetes.io/component={component}"
    return (
        client.CoreV1Api(cluster.api)
        .list_namespaced_pod(rel.namespace, label_selector=selector)
        .items
    )


def device_plugin_pod(cluster, rel: Release, node: str) -> client.V1Pod:
    (pod,) = [p for p in component_pods(cluster, rel, "device-plugin") if p.spec.node_name == node]
    return pod


def forbidden(call: Callable[[], object]) -> str:
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status == 403, err.value.body
    return json.loads(err.value.body)["message"]
