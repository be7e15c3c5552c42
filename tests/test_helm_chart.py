"""The Helm chart without a cluster: lint, render, RBAC, the schema's rejections, images.

Needs the pinned helm binary that `make cluster-build` puts in the cache; the
tests skip, saying so, when it is not built.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from device_plugin.config import SETTINGS as PLUGIN_SETTINGS
from e2e.cluster.components import extender_resources, infergrid_profile
from gateway.config import SETTINGS as GATEWAY_SETTINGS
from gateway.config import GatewayConfig, check
from gateway.tenants import TenantLimits
from images import cluster_binaries
from inference_operator.config import SETTINGS as OPERATOR_SETTINGS
from infergrid import constants, dra
from infergrid.settings import parse_settings
from scheduler_extender.config import DEFAULT_PREEMPTIBLE
from scheduler_extender.config import SETTINGS as EXTENDER_SETTINGS

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "infergrid"
VALUE_SETS = sorted((ROOT / "deploy" / "helm" / "values").glob("*.yaml"))
KUBE_VERSION = cluster_binaries.versions()["K8S_VERSION"]
HELM = cluster_binaries.paths()["helm"]
NAMESPACE = "infergrid-system"

needs_helm = pytest.mark.skipif(
    not HELM.exists(), reason=f"helm is not built ({HELM}); run `make cluster-build`"
)


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60)


def render(*args: str, release: str = "ig") -> list[dict]:
    done = helm(
        "template", release, str(CHART), "--namespace", NAMESPACE,
        "--kube-version", KUBE_VERSION, *args,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict], kind: str, suffix: str) -> dict:
    found = [o for o in by_kind(objects, kind) if o["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, (kind, suffix, [o["metadata"]["name"] for o in found])
    return found[0]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def default() -> list[dict]:
    if not HELM.exists():
        pytest.skip(f"helm is not built ({HELM}); run `make cluster-build`")
    return render()


def test_value_sets_exist():
    assert len(VALUE_SETS) >= 3, VALUE_SETS


def test_crds_in_chart_are_the_repository_crds():
    """Helm installs crds/ of the chart; it must be the same bytes as crds/."""
    repo = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert repo, "no CRDs in crds/"
    assert chart.keys() == repo.keys(), "the chart's crds/ and crds/ list different files"
    for name in repo:
        assert chart[name] == repo[name], (
            f"deploy/helm/infergrid/crds/{name} differs from crds/{name}: "
            f"cp crds/{name} deploy/helm/infergrid/crds/"
        )


@needs_helm
@pytest.mark.parametrize("values", [None, *VALUE_SETS], ids=lambda v: v.name if v else "default")
def test_lint_strict(values):
    args = ["-f", str(values)] if values else []
    done = helm("lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART), *args)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_helm
@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda v: v.name)
def test_value_sets_render(values):
    objects = render("-f", str(values))
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "DaemonSet", "ValidatingAdmissionPolicy"} <= kinds
    check_labels(objects)
    check_rbac(objects)


def test_default_renders_every_part(default):
    names = {(o["kind"], o["metadata"]["name"]) for o in default}
    assert ("Deployment", "ig-infergrid-operator") in names
    assert ("Deployment", "ig-infergrid-gateway") in names
    assert ("Service", "ig-infergrid-gateway") in names
    assert ("Service", "ig-infergrid-gateway-metrics") in names
    assert ("Deployment", "ig-infergrid-scheduler") in names
    assert ("DaemonSet", "ig-infergrid-device-plugin") in names
    assert ("ValidatingAdmissionPolicy", "ig-infergrid-gpu-assignment") in names
    assert ("ValidatingAdmissionPolicyBinding", "ig-infergrid-gpu-assignment") in names
    accounts = {o["metadata"]["name"] for o in by_kind(default, "ServiceAccount")}
    assert accounts == {
        "ig-infergrid-operator",
        "ig-infergrid-gateway",
        "ig-infergrid-scheduler",
        "ig-infergrid-extender",
        "ig-infergrid-device-plugin",
    }
    # Optional parts stay out unless asked for.
    assert not by_kind(default, "ServiceMonitor")
    assert not [o for o in by_kind(default, "ConfigMap") if "dashboard" in o["metadata"]["name"]]


def check_labels(objects: list[dict]) -> None:
    for o in objects:
        labels = o["metadata"].get("labels", {})
        for key in ("name", "instance", "version", "managed-by", "component", "part-of"):
            assert f"app.kubernetes.io/{key}" in labels, (o["kind"], o["metadata"]["name"], key)
        if o["kind"] in ("Deployment", "DaemonSet"):
            selector = o["spec"]["selector"]["matchLabels"]
            template = o["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= template.items()
            assert "app.kubernetes.io/version" not in selector  # immutable across upgrades


def test_labels(default):
    check_labels(default)


def check_rbac(objects: list[dict]) -> None:
    """No wildcard, no escalation verbs, every subject one of the chart's accounts; no Secrets,
    but the gateway's one Secret of API keys (get, by name, in a Role of that namespace) and
    the operator's engine token Secrets (get, create, patch; never listed or watched)."""
    accounts = {o["metadata"]["name"] for o in by_kind(objects, "ServiceAccount")}
    roles = by_kind(objects, "ClusterRole") + by_kind(objects, "Role")
    assert roles
    for role in roles:
        where = f"{role['kind']} {role['metadata']['name']}"
        for rule in role["rules"]:
            for field in ("verbs", "resources", "apiGroups", "resourceNames"):
                assert "*" not in rule.get(field, []), f"{where}: wildcard in {field}"
                assert not any("*" in v for v in rule.get(field, []) if v), where
            assert "nonResourceURLs" not in rule, where
            if "secrets" in rule["resources"] and role["metadata"]["name"].endswith("-operator"):
                # Each service's engine token Secret: read by name before it is written.
                assert rule["resources"] == ["secrets"], where
                assert rule["verbs"] == ["get", "create", "patch"], f"{where}: lists Secrets"
            elif "secrets" in rule["resources"]:
                assert role["kind"] == "Role", f"{where} grants Secrets cluster-wide"
                assert role["metadata"]["name"].endswith("-gateway-api-keys"), where
                assert rule["resources"] == ["secrets"] and rule["verbs"] == ["get"], where
                assert len(rule.get("resourceNames", [])) == 1, f"{where}: Secrets not by name"
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), where
    for binding in by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding"):
        assert binding["roleRef"]["name"] in {r["metadata"]["name"] for r in roles}
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount" and subject["name"] in accounts
            assert subject["namespace"] == NAMESPACE


def test_rbac_least_privilege(default):
    check_rbac(default)


def rules_of(objects: list[dict], kind: str, name: str) -> set[tuple[str, str, str]]:
    role = one(objects, kind, name)
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_matches_what_each_component_calls(default):
    plugin = rules_of(default, "ClusterRole", "-device-plugin")
    assert plugin == {("", "nodes", "patch"), ("", "pods", "get"), ("", "pods", "list"),
                      ("", "pods", "patch"), ("", "pods/status", "patch"),
                      ("", "nodes/status", "patch"), ("", "events", "create")}  # fmt: skip
    extender = rules_of(default, "ClusterRole", "-extender")
    assert extender == {("", "nodes", "list"), ("", "nodes", "watch"), ("", "pods", "get"),
                        ("", "pods", "list"), ("", "pods", "watch"),
                        ("", "pods/binding", "create"),
                        ("", "pods/eviction", "create"), ("", "pods", "delete"),
                        ("", "events", "create"),
                        ("resource.k8s.io", "resourceclaims", "list"),
                        ("resource.k8s.io", "resourceclaims", "watch"),
                        ("resource.k8s.io", "resourceslices", "list"),
                        ("resource.k8s.io", "resourceslices", "watch"),
                        ("resource.k8s.io", "deviceclasses", "get")}  # fmt: skip
    gateway = rules_of(default, "ClusterRole", "-gateway")
    assert gateway == {("infergrid.io", "inferenceservices", "list"),
                       ("infergrid.io", "inferenceservices", "watch"),
                       ("infergrid.io", "inferenceservices/scale", "get"),
                       ("infergrid.io", "inferenceservices/scale", "patch"),
                       ("discovery.k8s.io", "endpointslices", "list"),
                       ("discovery.k8s.io", "endpointslices", "watch"),
                       ("", "pods", "list"), ("", "pods", "watch")}  # fmt: skip
    # The default keys Secret, by name, is the one thing the gateway reads in a Role.
    roles = [r for r in by_kind(default, "Role") if "-gateway" in r["metadata"]["name"]]
    assert [r["rules"] for r in roles] == [[{"apiGroups": [""], "resources": ["secrets"],
        "resourceNames": ["infergrid-gateway-keys"], "verbs": ["get"]}]]  # fmt: skip
    operator = rules_of(default, "ClusterRole", "-operator")
    assert ("infergrid.io", "inferenceservices/scale", "patch") in operator
    assert ("infergrid.io", "inferenceservices/status", "patch") in operator
    assert ("apps", "deployments", "delete") in operator
    assert ("", "configmaps", "delete") in operator  # old engine configs, its own only
    assert ("", "services", "get") in operator  # a child's name is checked before a write
    assert ("", "services", "delete") not in operator
    assert ("apps", "replicasets", "list") in operator
    for verb in ("get", "list", "watch", "create", "update", "patch", "delete"):
        assert ("resource.k8s.io", "resourceclaimtemplates", verb) in operator
    # Leases: only the component's own, by name, in the release namespace.
    for suffix, lease in (("-scheduler", "ig-infergrid-scheduler"),
                          ("-extender", "ig-infergrid-extender")):  # fmt: skip
        role = one(default, "Role", suffix)
        assert role["metadata"]["namespace"] == NAMESPACE
        named = [
            r for r in role["rules"] if r.get("resourceNames") and r["resources"] == ["leases"]
        ]
        assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                          "resourceNames": [lease], "verbs": ["get", "update"]}]  # fmt: skip
    # The extender mints kube-scheduler's token, and no other account's.
    tokens = [r for r in one(default, "Role", "-extender")["rules"]
              if r["resources"] == ["serviceaccounts/token"]]  # fmt: skip
    assert tokens == [{"apiGroups": [""], "resources": ["serviceaccounts/token"],
                       "resourceNames": ["ig-infergrid-scheduler"],
                       "verbs": ["create"]}]  # fmt: skip


def test_operator_namespaced_rbac():
    if not HELM.exists():
        pytest.skip(f"helm is not built ({HELM})")
    objects = render("--set", "operator.watchNamespaces={team-a,team-b}")
    bindings = [
        b for b in by_kind(objects, "RoleBinding") if b["metadata"]["name"].endswith("-operator")
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    cluster = {b["metadata"]["name"] for b in by_kind(objects, "ClusterRoleBinding")}
    assert "ig-infergrid-operator" not in cluster  # no cluster-wide rights
    assert "ig-infergrid-operator-discovery" in cluster  # kopf reads CRDs, not namespaces
    discovery = rules_of(objects, "ClusterRole", "-operator-discovery")
    assert discovery == {
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    }
    config = yaml.safe_load(one(objects, "ConfigMap", "-operator")["data"]["operator.yaml"])
    assert config["namespaces"] == ["team-a", "team-b"]


def gateway_config(objects: list[dict]) -> GatewayConfig:
    """The gateway's settings file as gateway/config.py reads it (unknown keys refused)."""
    doc = yaml.safe_load(one(objects, "ConfigMap", "-gateway")["data"]["gateway.yaml"])
    return check(GatewayConfig(**parse_settings(doc, GATEWAY_SETTINGS)))


def test_gateway_deployment(default):
    deployment = one(default, "Deployment", "-gateway")
    spec = pod_spec(deployment)
    (container,) = spec["containers"]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert spec["serviceAccountName"] == "ig-infergrid-gateway"
    assert container["image"] == "infergrid/gateway:0.1.0"
    assert container["command"] == ["infergrid-gateway"]
    assert "--config=/etc/infergrid/gateway.yaml" in container["args"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "metrics": 9090}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    cfg = gateway_config(default)
    assert (cfg.port, cfg.metrics_port) == (8080, 9090)
    assert (cfg.namespaces, cfg.api_keys_secret) == ((), f"{NAMESPACE}/infergrid-gateway-keys")
    assert cfg.allow_anonymous is False  # keys are required by default
    assert (cfg.routing, cfg.hold_queue, cfg.scale_from_zero) == ("least-loaded", 64, True)
    assert spec["terminationGracePeriodSeconds"] > cfg.drain_s
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True
    # Two pods: spread over nodes where possible, and one at most disrupted at a time.
    anti = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    budget = one(default, "PodDisruptionBudget", "-gateway")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}


def test_gateway_services(default):
    selector = one(default, "Deployment", "-gateway")["spec"]["selector"]["matchLabels"]
    api = one(default, "Service", "-gateway")
    assert api["metadata"]["name"] == "ig-infergrid-gateway"
    assert api["spec"]["type"] == "ClusterIP" and api["spec"]["selector"] == selector
    assert [(p["port"], p["targetPort"]) for p in api["spec"]["ports"]] == [(80, "http")]
    metrics = one(default, "Service", "-gateway-metrics")
    assert metrics["metadata"]["name"] == "ig-infergrid-gateway-metrics"
    assert metrics["spec"]["selector"] == selector
    assert [(p["port"], p["targetPort"]) for p in metrics["spec"]["ports"]] == [(9090, "metrics")]


@needs_helm
def test_gateway_settings_reach_its_config_and_pods():
    objects = render(
        "--set", "gateway.replicas=1", "--set-json", "gateway.drainSeconds=100.5",
        "--set", "gateway.routing=round-robin", "--set", "gateway.holdQueue=0",
        "--set", "gateway.scaleFromZero=false", "--set", "gateway.metricsPort=9191",
        "--set", "gateway.service.port=8000",
    )  # fmt: skip
    cfg = gateway_config(objects)
    assert (cfg.routing, cfg.hold_queue, cfg.scale_from_zero) == ("round-robin", 0, False)
    assert (cfg.drain_s, cfg.metrics_port) == (100.5, 9191)
    deployment = one(objects, "Deployment", "-gateway")
    assert deployment["spec"]["replicas"] == 1
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] == 116
    assert not by_kind(objects, "PodDisruptionBudget")  # one pod: nothing to keep up
    (container,) = pod_spec(deployment)["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"] == 9191
    assert one(objects, "Service", "-gateway")["spec"]["ports"][0]["port"] == 8000
    assert one(objects, "Service", "-gateway-metrics")["spec"]["ports"][0]["port"] == 9191
    operator = yaml.safe_load(one(objects, "ConfigMap", "-operator")["data"]["operator.yaml"])
    assert operator["gatewayMetricsUrl"] == (
        f"http://ig-infergrid-gateway-metrics.{NAMESPACE}.svc:9191/metrics"
    )


def test_the_operator_reads_the_gateways_held_requests(default):
    """The operator's autoscaler reads infergrid_gateway_pending_requests from the gateway's
    metrics Service; without a gateway, from nowhere."""
    config = yaml.safe_load(one(default, "ConfigMap", "-operator")["data"]["operator.yaml"])
    url = f"http://ig-infergrid-gateway-metrics.{NAMESPACE}.svc:9090/metrics"
    assert config["gatewayMetricsUrl"] == url
    assert parse_settings(config, OPERATOR_SETTINGS)["gateway_metrics_url"] == url
    off = render("--set", "gateway.enabled=false")
    assert not [o for o in off if o["metadata"]["name"].startswith("ig-infergrid-gateway")]
    config = yaml.safe_load(one(off, "ConfigMap", "-operator")["data"]["operator.yaml"])
    assert "gatewayMetricsUrl" not in config


@needs_helm
def test_gateway_reads_only_the_named_secret_in_its_namespace():
    objects = render("--set", "gateway.apiKeysSecret.name=tenant-keys",
                     "--set", "gateway.apiKeysSecret.namespace=keys-ns")  # fmt: skip
    check_rbac(objects)
    assert gateway_config(objects).api_keys_secret == "keys-ns/tenant-keys"
    role = one(objects, "Role", "-gateway-api-keys")
    assert role["metadata"]["namespace"] == "keys-ns"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"],
                              "resourceNames": ["tenant-keys"], "verbs": ["get"]}]  # fmt: skip
    binding = one(objects, "RoleBinding", "-gateway-api-keys")
    assert binding["metadata"]["namespace"] == "keys-ns"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}  # fmt: skip
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ig-infergrid-gateway",
                                    "namespace": NAMESPACE}]  # fmt: skip
    # No Secret anywhere else, by any other role.
    secret_roles = [r["metadata"]["name"] for r in by_kind(objects, "ClusterRole")
                    + by_kind(objects, "Role")
                    if any("secrets" in rule["resources"] for rule in r["rules"])]  # fmt: skip
    # ... but the operator's engine token Secrets (check_rbac).
    assert sorted(secret_roles) == ["ig-infergrid-gateway-api-keys", "ig-infergrid-operator"]
    # The namespace defaults to the release's.
    objects = render("--set", "gateway.apiKeysSecret.name=tenant-keys")
    assert gateway_config(objects).api_keys_secret == f"{NAMESPACE}/tenant-keys"
    assert one(objects, "Role", "-gateway-api-keys")["metadata"]["namespace"] == NAMESPACE


@needs_helm
def test_gateway_namespaced_rbac():
    objects = render("--set", "gateway.watchNamespaces={team-a,team-b}")
    check_rbac(objects)
    bindings = [
        b for b in by_kind(objects, "RoleBinding") if b["metadata"]["name"].endswith("-gateway")
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert {b["roleRef"]["name"] for b in bindings} == {"ig-infergrid-gateway"}
    cluster = {b["metadata"]["name"] for b in by_kind(objects, "ClusterRoleBinding")}
    assert not {n for n in cluster if "-gateway" in n}  # no cluster-wide rights
    assert gateway_config(objects).namespaces == ("team-a", "team-b")


def test_scheduler_configuration_matches_the_local_cluster(default):
    """Same extender settings and managedResources as e2e/cluster/components.py."""
    data = one(default, "ConfigMap", "-scheduler")["data"]
    config = yaml.safe_load(data["scheduler-config.yaml"])
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["profiles"] == [infergrid_profile(constants.SCHEDULER_NAME)]
    assert config["percentageOfNodesToScore"] == 100
    assert config["leaderElection"] == {
        "leaderElect": True,
        "resourceLock": "leases",
        "resourceNamespace": NAMESPACE,
        "resourceName": "ig-infergrid-scheduler",
        # Longer than upstream's 15s/10s/2s, so an API server or etcd outage of up to 45 s
        # passes without kube-scheduler exiting (e2e/test_faults_cluster.py).
        "leaseDuration": "60s",
        "renewDeadline": "45s",
        "retryPeriod": "5s",
    }
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "http://127.0.0.1:8888"
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is False
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter", "prioritize", "bind",
    )  # fmt: skip
    ignored = {constants.RESOURCE_GPU_MEMORY, constants.RESOURCE_GPU_CORES, dra.RESOURCE_GPU_CLAIM}
    assert extender["managedResources"] == [
        {"name": name, "ignoredByScheduler": name in ignored} for name in extender_resources()
    ]
    ext = yaml.safe_load(data["extender.yaml"])
    assert ext["host"] == "127.0.0.1" and ext["port"] == 8888
    assert ext["leaderElection"] is True
    assert (ext["leaseNamespace"], ext["leaseName"]) == (NAMESPACE, "ig-infergrid-extender")


def test_scheduler_pod_gives_each_container_its_own_token(default):
    """The extender holds the pod's projected token; kube-scheduler, one the extender mints
    for kube-scheduler's own account into a memory emptyDir: no token Secret exists."""
    deployment = one(default, "Deployment", "-scheduler")
    spec = pod_spec(deployment)
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert spec["serviceAccountName"] == "ig-infergrid-extender"
    assert spec["automountServiceAccountToken"] is False
    (extender,) = spec["initContainers"]
    assert extender["name"] == "extender" and extender["restartPolicy"] == "Always"
    assert "/scheduler-token/token" in " ".join(extender["startupProbe"]["exec"]["command"])
    containers = {c["name"]: c for c in [*spec["containers"], extender]}
    assert set(containers) == {"kube-scheduler", "extender"}
    token_path = "/var/run/secrets/kubernetes.io/serviceaccount"
    mounts = {
        name: {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        for name, c in containers.items()
    }
    assert mounts["extender"][token_path] == "extender-token"
    assert mounts["kube-scheduler"][token_path] == "scheduler-token"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["scheduler-token"]["emptyDir"]["medium"] == "Memory"
    secrets = [s["metadata"]["name"] for s in by_kind(default, "Secret")]
    assert secrets == ["ig-infergrid-engine-auth"]  # the engine token key, no account's token
    ext = yaml.safe_load(one(default, "ConfigMap", "-scheduler")["data"]["extender.yaml"])
    assert mounts["extender"][ext["schedulerTokenDir"]] == "scheduler-token"
    assert ext["schedulerServiceAccount"] == "ig-infergrid-scheduler"
    args = containers["kube-scheduler"]["args"]
    assert "--config=/etc/infergrid/scheduler-config.yaml" in args
    assert containers["kube-scheduler"]["image"] == f"registry.k8s.io/kube-scheduler:{KUBE_VERSION}"


def test_operator_deployment(default):
    deployment = one(default, "Deployment", "-operator")
    (container,) = pod_spec(deployment)["containers"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    config = yaml.safe_load(one(default, "ConfigMap", "-operator")["data"]["operator.yaml"])
    assert config["livenessEndpoint"] == "http://0.0.0.0:8080/healthz"
    assert config["engineImage"] == "infergrid/engine:0.1.0"
    assert config["schedulerName"] == constants.SCHEDULER_NAME
    assert (config["hfCacheClaim"], config["allowModelDownload"]) == ("", False)
    assert parse_settings(config, OPERATOR_SETTINGS)["hf_cache_claim"] == ""


@needs_helm
def test_the_operator_reads_the_model_storage_values():
    objects = render("--set", "operator.hfCacheClaim=hf-cache.team-a",
                     "--set", "operator.allowModelDownload=true")  # fmt: skip
    config = yaml.safe_load(one(objects, "ConfigMap", "-operator")["data"]["operator.yaml"])
    settings = parse_settings(config, OPERATOR_SETTINGS)
    assert settings["hf_cache_claim"] == "hf-cache.team-a"
    assert settings["allow_model_download"] is True


def test_the_operator_allows_only_the_listed_priority_classes(default):
    """The chart's own two classes, and those listed; without the chart's, only those listed."""

    def allowed(objects: list[dict]) -> tuple[str, ...]:
        config = yaml.safe_load(one(objects, "ConfigMap", "-operator")["data"]["operator.yaml"])
        return parse_settings(config, OPERATOR_SETTINGS)["allowed_priority_classes"]

    assert allowed(default) == ("infergrid-online", "infergrid-offline")
    listed = "operator.allowedPriorityClasses={batch-low,infergrid-online}"
    assert allowed(render("--set", listed)) == (
        "batch-low",
        "infergrid-online",
        "infergrid-offline",
    )
    assert allowed(render("--set", listed, "--set", "priorityClasses.create=false")) == (
        "batch-low",
        "infergrid-online",
    )


def test_the_chart_makes_an_online_class_that_preempts_and_an_offline_one_that_never_does(
    default,
):
    classes = {c["metadata"]["name"]: c for c in by_kind(default, "PriorityClass")}
    assert set(classes) == {"infergrid-online", "infergrid-offline"}
    online, offline = classes["infergrid-online"], classes["infergrid-offline"]
    assert online["value"] > offline["value"] > 0
    assert online["preemptionPolicy"] == "PreemptLowerPriority"
    assert offline["preemptionPolicy"] == "Never"
    assert not online["globalDefault"] and not offline["globalDefault"]
    assert not by_kind(render("--set", "priorityClasses.create=false"), "PriorityClass")


def test_the_extender_may_evict_only_while_it_leads_preemption(default):
    config = yaml.safe_load(
        one(default, "ConfigMap", "-scheduler")["data"]["scheduler-config.yaml"]
    )
    assert config["extenders"][0]["preemptVerb"] == "preempt"
    off = render("--set", "scheduler.extender.preemptionHoldSeconds=0")
    rules = rules_of(off, "ClusterRole", "-extender")
    assert ("", "pods/eviction", "create") not in rules and ("", "events", "create") not in rules


def test_device_plugin_daemonset(default):
    ds = one(default, "DaemonSet", "-device-plugin")
    spec = pod_spec(ds)
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"], "the device plugin must only run on GPU nodes"
    (container,) = spec["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    plugins = next(v for v in spec["volumes"] if v["name"] == "device-plugins")
    assert plugins["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "device-plugins")
    assert mount["mountPath"] == "/var/lib/kubelet/device-plugins"
    security = container["securityContext"]
    assert security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False
    config = yaml.safe_load(
        one(default, "ConfigMap", "-device-plugin")["data"]["device-plugin.yaml"]
    )
    assert config["pluginDir"] == "/var/lib/kubelet/device-plugins"
    assert "nodeName" not in config  # from NODE_NAME
    # It sees every GPU through NVML unprivileged, also where the runtime ignores the env
    # var: a device-list mount of "all"; and it reads the kubelet's PodResources.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/var/run/nvidia-container-devices/all"]]["hostPath"] == {
        "path": "/dev/null", "type": "CharDevice"}  # fmt: skip
    assert volumes[mounts["/var/lib/kubelet/pod-resources"]]["hostPath"]["type"] == "Directory"
    assert config["deviceListStrategy"] == "volume-mounts"
    assert config["podResourcesSocket"] == "/var/lib/kubelet/pod-resources/kubelet.sock"


@needs_helm
def test_the_device_plugin_gives_gpus_to_pods_of_the_scheduler_the_chart_runs():
    """Renaming the scheduler renames it for the plugin's Allocate check too."""
    objects = render("--set", "schedulerName=infergrid-chart")
    scheduler = yaml.safe_load(
        one(objects, "ConfigMap", "-scheduler")["data"]["scheduler-config.yaml"]
    )
    assert [p["schedulerName"] for p in scheduler["profiles"]] == ["infergrid-chart"]
    plugin = yaml.safe_load(
        one(objects, "ConfigMap", "-device-plugin")["data"]["device-plugin.yaml"]
    )
    assert parse_settings(plugin, PLUGIN_SETTINGS)["scheduler_name"] == "infergrid-chart"


def test_device_plugin_is_privileged_only_when_asked():
    if not HELM.exists():
        pytest.skip(f"helm is not built ({HELM})")
    objects = render("--set", "devicePlugin.privileged=true")
    (container,) = pod_spec(one(objects, "DaemonSet", "-device-plugin"))["containers"]
    assert container["securityContext"] == {"privileged": True}


def test_device_plugin_gets_mig_monitoring_privileges_only_when_asked(default):
    (container,) = pod_spec(one(default, "DaemonSet", "-device-plugin"))["containers"]
    assert "NVIDIA_MIG_MONITOR_DEVICES" not in {e["name"] for e in container["env"]}
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}

    objects = render("--set", "devicePlugin.migMonitoring=true")
    (container,) = pod_spec(one(objects, "DaemonSet", "-device-plugin"))["containers"]
    env = [e for e in container["env"] if e["name"] == "NVIDIA_MIG_MONITOR_DEVICES"]
    assert env == [{"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}]
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert (security["privileged"], security["allowPrivilegeEscalation"]) == (False, False)

    objects = render(
        "--set", "devicePlugin.migMonitoring=true", "--set", "devicePlugin.privileged=true"
    )
    (container,) = pod_spec(one(objects, "DaemonSet", "-device-plugin"))["containers"]
    assert {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"} in container["env"]
    assert container["securityContext"] == {"privileged": True}


def test_with_mps_a_control_daemon_container_runs_beside_the_plugin(default):
    """mps: true adds the daemons' container, sharing the plugin's config; both mount the
    daemons' host folder at its own path (Allocate hands holders the same paths) and its
    shared memory at /dev/shm. Without MPS neither exists, and the plugin keeps utility only."""
    (plain,) = pod_spec(one(default, "DaemonSet", "-device-plugin"))["containers"]
    assert {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"} in plain["env"]
    objects = render("--set", "devicePlugin.config.mps=true",
                     "--set", "devicePlugin.config.mpsDefaultCores=20")  # fmt: skip
    spec = pod_spec(one(objects, "DaemonSet", "-device-plugin"))
    plugin, daemon = spec["containers"]
    assert (plugin["name"], daemon["name"]) == ("device-plugin", "mps-control-daemon")
    assert daemon["image"] == plugin["image"]
    assert daemon["command"] == ["infergrid-mps-daemon"]
    assert "--config=/etc/infergrid/device-plugin.yaml" in daemon["args"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for container in (plugin, daemon):
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        root = volumes[mounts["/run/infergrid/mps"]]["hostPath"]
        shm = volumes[mounts["/dev/shm"]]["hostPath"]
        assert root == {"path": "/run/infergrid/mps", "type": "DirectoryOrCreate"}
        assert shm == {"path": "/run/infergrid/mps/shm", "type": "DirectoryOrCreate"}
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility", container["name"]
    assert daemon["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    config = yaml.safe_load(
        one(objects, "ConfigMap", "-device-plugin")["data"]["device-plugin.yaml"]
    )
    settings = parse_settings(config, PLUGIN_SETTINGS)
    assert settings["mps"] is True and settings["mps_default_cores"] == 20
    assert settings["mps_control"] == "nvidia-cuda-mps-control"


def test_on_fake_nvml_the_mps_daemons_are_the_stand_in(default):
    """A fleet file means no driver: the control program is the fake one, unless named."""
    fleet = ("--set", "devicePlugin.fakeFleet=nodes: []", "--set", "devicePlugin.config.mps=true")
    for extra, control in (
        ((), "infergrid-fake-mps-control"),
        (("--set", "devicePlugin.config.mpsControl=/opt/mps"), "/opt/mps"),
    ):
        objects = render(*fleet, *extra)
        config = one(objects, "ConfigMap", "-device-plugin")["data"]["device-plugin.yaml"]
        assert yaml.safe_load(config)["mpsControl"] == control  # fmt: skip


def test_only_the_device_plugin_runs_as_root(default):
    for workload in by_kind(default, "Deployment") + by_kind(default, "DaemonSet"):
        for c in pod_spec(workload)["containers"]:
            security = c["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, c["name"]
            assert security["allowPrivilegeEscalation"] is False, c["name"]
            if c["name"] not in ("device-plugin", "mps-control-daemon"):
                assert security["runAsNonRoot"] is True and security["runAsUser"] != 0


def test_admission_policy_names_the_extender(default):
    policy = one(default, "ValidatingAdmissionPolicy", "-gpu-assignment")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    assert "pods" in rule["resources"]
    (validation,) = policy["spec"]["validations"]
    users = f"system:serviceaccount:{NAMESPACE}:ig-infergrid-"
    assert f"{users}extender" in validation["expression"]
    assert f"{users}device-plugin" in validation["expression"]
    binding = one(default, "ValidatingAdmissionPolicyBinding", "-gpu-assignment")
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]


def test_the_extenders_bindings_may_carry_the_assignment_and_nothing_else(default):
    """It binds in one call, the assignment riding on the Binding (scheduler_extender/
    binder.py); anyone else's Binding with one is the -gpu-assignment policy's to refuse."""
    policy = one(default, "ValidatingAdmissionPolicy", "-extender")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["key"] == repr(constants.ANNOTATION_GPU_ASSIGNMENT)
    assert variables["onlyAssignmentCarried"] == (
        "size(variables.newLabels) == 0 && variables.newAnnotations.all(k, k == variables.key)"
    )
    (validation,) = policy["spec"]["validations"]
    binding_branch = validation["expression"].split(":")[0]
    assert binding_branch == (
        "variables.isBinding ? request.operation == 'CREATE' && variables.onlyAssignmentCarried "
    )
    everyone = one(default, "ValidatingAdmissionPolicy", "-gpu-assignment")
    (rule,) = everyone["spec"]["matchConstraints"]["resourceRules"]
    assert {"pods/binding", "bindings"} <= set(rule["resources"])


def test_the_device_plugin_may_change_only_its_condition_in_a_pods_status(default):
    policy = one(default, "ValidatingAdmissionPolicy", "-device-plugin-status")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["resources"], rule["operations"]) == (["pods/status"], ["UPDATE"])
    (match,) = policy["spec"]["matchConditions"]
    assert f"system:serviceaccount:{NAMESPACE}:ig-infergrid-device-plugin'" in match["expression"]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["gpuHealthy"] == repr(constants.CONDITION_GPU_HEALTHY)
    binding = one(default, "ValidatingAdmissionPolicyBinding", "-device-plugin-status")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_monitoring_parts():
    if not HELM.exists():
        pytest.skip(f"helm is not built ({HELM})")
    objects = render("-f", str(ROOT / "deploy/helm/values/monitoring.yaml"))
    monitors = {o["metadata"]["name"] for o in by_kind(objects, "ServiceMonitor")}
    assert monitors == {
        "ig-infergrid-device-plugin",
        "ig-infergrid-extender",
        "ig-infergrid-gateway",
        "ig-infergrid-engines",
    }
    gateway = one(objects, "ServiceMonitor", "-gateway")
    assert gateway["spec"]["endpoints"][0]["port"] == "metrics"
    # The plugin's series name the pods that hold each GPU: Prometheus keeps its labels.
    plugin = one(objects, "ServiceMonitor", "-device-plugin")
    assert plugin["spec"]["endpoints"][0]["honorLabels"] is True
    labels = one(objects, "Service", "-gateway-metrics")["metadata"]["labels"]
    assert gateway["spec"]["selector"]["matchLabels"].items() <= labels.items()
    dashboard = json.loads(one(objects, "ConfigMap", "-dashboard")["data"]["infergrid.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in (
        "infergrid_device_plugin_gpu_memory_used_mib",
        "infergrid_scheduler_extender_placements_total",
        "infergrid_engine_queue_depth",
        "infergrid_engine_ttft_seconds_bucket",
        "infergrid_engine_tpot_seconds_bucket",
    ):
        assert metric in exprs, metric
    # Every metric the dashboard reads is one a part exports (the engine builds its
    # names from a prefix, so its file holds the rest of each name).
    code = "".join(
        (ROOT / f).read_text()
        for f in ("device_plugin/metrics.py", "scheduler_extender/metrics.py")
    )
    engine = ROOT / "batching_engine" / "metrics.py"
    contract = (ROOT / "infergrid" / "constants.py").read_text()
    for name in set(re.findall(r"infergrid_[a-z_]+", exprs)):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if base.startswith("infergrid_engine_"):
            if engine.exists():
                rest = base.removeprefix("infergrid_engine_")
                known = f'"{rest}"' in engine.read_text() or f'"{base}"' in contract
                assert known, f"the engine exports no {base}"
        else:
            assert f'"{base}"' in code, f"the dashboard reads {name}, which no part exports"
    # Prometheus reads the metrics listener; the verbs stay on loopback.
    ext = yaml.safe_load(one(objects, "ConfigMap", "-scheduler")["data"]["extender.yaml"])
    assert (ext["host"], ext["metricsAddress"], ext["metricsPort"]) == (
        "127.0.0.1",
        "0.0.0.0",
        9464,
    )
    (extender,) = pod_spec(one(objects, "Deployment", "-scheduler"))["initContainers"]
    assert extender["ports"] == [{"name": "http", "containerPort": 9464, "protocol": "TCP"}]
    policy = one(objects, "NetworkPolicy", "-scheduler")
    ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert sorted(ports) == [9464, 10259]


# An invalid value, and the key the error must name.
INVALID = [
    (["--set", "replicaCount=2"], "additional properties 'replicaCount' not allowed"),
    (["--set", "devicePlugin.confg.mps=true"], "at '/devicePlugin': additional properties 'confg'"),
    (["--set", "scheduler.replicas=2"], "/scheduler/replicas"),
    (["--set", "scheduler.extender.defaultPolicy=random"], "/scheduler/extender/defaultPolicy"),
    (["--set", "devicePlugin.config.vgpuSlotsPerGpu=0"], "/devicePlugin/config/vgpuSlotsPerGpu"),
    (["--set", "devicePlugin.config.migStrategy=both"], "/devicePlugin/config/migStrategy"),
    (["--set-string", "devicePlugin.migMonitoring=yes"], "/devicePlugin/migMonitoring"),
    (["--set", "devicePlugin.config.usageIntervalSeconds=30"],
     "/devicePlugin/config/usageIntervalSeconds"),
    (["--set", "operator.watchNamespaces={Team_A}"], "/operator/watchNamespaces/0"),
    (["--set", "operator.image.digest=sha256:abc"], "/operator/image/digest"),
    (["--set-json", "operator.image.tag=1.0"], "/operator/image/tag"),
    (["--set", "schedulerName="], "/schedulerName"),
    (["--set", "scheduler.extender.exposeMetrics=true",
      "--set", "scheduler.extender.metricsPort=8888"],
     "scheduler.extender.metricsPort (8888) must differ"),
    (["--set", "metrics.serviceMonitor.interval=soon"], "/metrics/serviceMonitor/interval"),
    (["--set", "devicePlugin.tolerations[0].operator=Maybe"],
     "/devicePlugin/tolerations/0/operator"),
    (["--set", "operator.resources.limits.memory=lots"], "/operator/resources/limits/memory"),
    (["--set", "operator.hfCacheClaim=HF_Cache"], "/operator/hfCacheClaim"),
    (["--set", "operator.hfCacheClaim=cache/models"], "/operator/hfCacheClaim"),
    (["--set-string", "operator.allowModelDownload=true"], "/operator/allowModelDownload"),
    (["--set", "operator.allowedPriorityClasses={system-node-critical}"],
     "/operator/allowedPriorityClasses/0"),
    (["--set", "gateway.replica=3"], "at '/gateway': additional properties 'replica'"),
    (["--set", "gateway.service.nodePort=30080"],
     "at '/gateway/service': additional properties 'nodePort'"),
    (["--set", "gateway.apiKeysSecret.key=tenants.yaml"],
     "at '/gateway/apiKeysSecret': additional properties 'key'"),
    (["--set", "gateway.routing=random"], "/gateway/routing"),
    (["--set", "gateway.replicas=0"], "/gateway/replicas"),
    (["--set", "gateway.watchNamespaces={Team_A}"], "/gateway/watchNamespaces/0"),
    (["--set", "gateway.apiKeysSecret.name=Keys_1"], "/gateway/apiKeysSecret/name"),
    (["--set", "gateway.apiKeysSecret.namespace=a/b"], "/gateway/apiKeysSecret/namespace"),
    (["--set", "gateway.service.type=External"], "/gateway/service/type"),
    (["--set", "gateway.holdTimeoutSeconds=-1"], "/gateway/holdTimeoutSeconds"),
    (["--set-string", "gateway.scaleFromZero=yes"], "/gateway/scaleFromZero"),
    # Checks across keys, in templates/_validate.tpl.
    (["--set", "scheduler.extender.staleAfterSeconds=3"],
     "scheduler.extender.staleAfterSeconds (3) must exceed "
     "devicePlugin.config.usageIntervalSeconds"),
    (["--set", "scheduler.extender.port=10259"],
     "scheduler.extender.port and scheduler.kubeScheduler.securePort"),
    (["--set", "gateway.metricsPort=8080"], "gateway.metricsPort (8080) must differ"),
    (["--set-json",
      'scheduler.managedResources=[{"name":"nvidia.com/gpu","ignoredByScheduler":false}]'],
     "scheduler.managedResources: infergrid.io/gpu-memory"),
]  # fmt: skip


@needs_helm
@pytest.mark.parametrize(("args", "message"), INVALID, ids=[m for _, m in INVALID])
def test_invalid_values_are_rejected_naming_the_key(args, message):
    done = helm("template", "ig", str(CHART), "--kube-version", KUBE_VERSION, *args)
    assert done.returncode != 0, f"{args} was accepted"
    assert message in done.stderr, done.stderr


def test_schema_forbids_unknown_keys_everywhere():
    """Every object of ours sets additionalProperties: false; free maps type their values."""
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node: dict, path: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, path
            for key, sub in node["properties"].items():
                walk(sub, f"{path}.{key}")
        elif node.get("type") == "object" and path != ".global":
            assert isinstance(node.get("additionalProperties"), dict), path
        for sub in node.get("oneOf", []):
            walk(sub, path)
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(schema, "")


def test_schema_covers_every_default_value():
    """values.yaml has no key the schema does not describe (and so would reject)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(value, node: dict, path: str) -> None:
        if isinstance(value, dict) and "properties" in node:
            for key, sub in value.items():
                assert key in node["properties"], f"{path}.{key} is not in values.schema.json"
                walk(sub, node["properties"][key], f"{path}.{key}")

    walk(values, schema, "")


COMPONENT_IMAGES = {
    "device-plugin": "infergrid-device-plugin",
    "scheduler-extender": "infergrid-scheduler-extender",
    "operator": "infergrid-operator",
    "gateway": "infergrid-gateway",
    "engine": "infergrid-engine",
}


@pytest.mark.parametrize("component", COMPONENT_IMAGES)
def test_dockerfiles(component):
    dockerfile = (ROOT / "images" / component / "Dockerfile").read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    scripts = pyproject["project"]["scripts"]
    entry = COMPONENT_IMAGES[component]
    assert entry in scripts
    assert f'ENTRYPOINT ["{entry}"]' in dockerfile
    assert re.search(r"^USER 65532:65532$", dockerfile, re.M), "must not run as root"
    assert dockerfile.count("FROM ${BASE}") == 2, "both stages from the pinned BASE"
    ignore = (ROOT / "images" / component / "Dockerfile.dockerignore").read_text()
    # `pip install /src` builds the one wheel of every part: each of its packages is copied.
    for package in pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]:
        top = package.split("/")[0]
        assert f"COPY {top} /src/{top}" in dockerfile, (component, top)
        assert f"!{top}/" in ignore.splitlines(), (component, top)
    if component == "engine":
        assert "nvidia/cuda:" in dockerfile and "[engine]" in dockerfile
    pins = (ROOT / "images" / "pins.env").read_text()
    assert "PYTHON_IMAGE=" in pins and "CUDA_IMAGE=" in pins
    assert "REPLACE" not in pins, "no placeholder digests: the offline build records digests"


def test_images_and_chart_agree():
    """The chart's default images are the ones `make images` builds, kube-scheduler pinned."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["operator"]["image"]["repository"] == "infergrid/operator"
    assert values["gateway"]["image"]["repository"] == "infergrid/gateway"
    assert values["scheduler"]["extender"]["image"]["repository"] == "infergrid/scheduler-extender"
    assert values["devicePlugin"]["image"]["repository"] == "infergrid/device-plugin"
    assert values["operator"]["engineImage"]["repository"] == "infergrid/engine"
    assert values["scheduler"]["kubeScheduler"]["image"]["tag"] == KUBE_VERSION
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version


def test_default_policy_offers_every_policy_a_pod_may_ask_for():
    schema = json.loads((CHART / "values.schema.json").read_text())
    extender = schema["properties"]["scheduler"]["properties"]["extender"]["properties"]
    assert extender["defaultPolicy"]["enum"] == list(constants.PLACEMENT_POLICIES)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["scheduler"]["extender"]["defaultPolicy"] == constants.DEFAULT_POLICY


@needs_helm
def test_the_charts_extender_holds_bursts_at_prioritize_instead_of_waiting_at_filter(default):
    data = one(default, "ConfigMap", "-scheduler")["data"]
    ext = parse_settings(yaml.safe_load(data["extender.yaml"]), EXTENDER_SETTINGS)
    assert (ext["tentative_reservation_s"], ext["bind_wait_s"]) == (10.0, 0.0)


# --- who may name a PriorityClass, and whom preemption may evict (issue 37, item 4) ----


def cel_literal(policy: dict, name: str) -> object:
    """A policy variable the chart renders as a JSON literal (a valid CEL literal too)."""
    (expression,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == name]
    return json.loads(expression)


@needs_helm
def test_pods_may_name_a_priority_class_only_where_their_namespace_tier_lists_it(default):
    policy = one(default, "ValidatingAdmissionPolicy", "-pod-priority")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    # On the pod itself, whoever creates it: a ReplicaSet's pods are checked too.
    assert (rule["resources"], rule["operations"]) == (["pods"], ["CREATE"])
    conditions = {c["name"]: c["expression"] for c in policy["spec"]["matchConditions"]}
    assert f'["kube-system","{NAMESPACE}"]' in conditions["not-exempt"]
    assert cel_literal(policy, "tiers") == {
        "online": ["infergrid-online", "infergrid-offline"],
        "offline": ["infergrid-offline"],
    }
    assert cel_literal(policy, "anywhere") == []
    system, tiered = policy["spec"]["validations"]
    assert system["expression"] == "!variables.class.startsWith('system-')"
    assert "variables.tiers[variables.tier]" in tiered["expression"]
    for message in (system["messageExpression"], tiered["messageExpression"]):
        assert "spec.priorityClassName" in message and "request.namespace" in message
        assert "admissionPolicy.podPriorityClasses" in message
    binding = one(default, "ValidatingAdmissionPolicyBinding", "-pod-priority")
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    label = values["admissionPolicy"]["podPriorityClasses"]["namespaceLabel"]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["label"] == repr(label)  # a CEL string literal


@needs_helm
def test_the_priority_policy_follows_its_values_and_goes_with_the_other_policies():
    objects = render(
        "--set", "admissionPolicy.podPriorityClasses.tiers.research={batch-low}",
        "--set", "admissionPolicy.podPriorityClasses.anywhere={cluster-default}",
        "--set", "admissionPolicy.podPriorityClasses.exemptNamespaces={kube-system,kube-flannel}",
        "--set", "admissionPolicy.namespaceSelector.matchLabels.team=a",
    )  # fmt: skip
    policy = one(objects, "ValidatingAdmissionPolicy", "-pod-priority")
    assert cel_literal(policy, "tiers")["research"] == ["batch-low"]
    assert cel_literal(policy, "anywhere") == ["cluster-default"]
    conditions = {c["name"]: c["expression"] for c in policy["spec"]["matchConditions"]}
    assert f'["kube-system","kube-flannel","{NAMESPACE}"]' in conditions["not-exempt"]
    binding = one(objects, "ValidatingAdmissionPolicyBinding", "-pod-priority")
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {"matchLabels": {"team": "a"}}
    off = render("--set", "admissionPolicy.enabled=false")
    assert not [o for o in off if o["metadata"]["name"].endswith("-pod-priority")]


@needs_helm
def test_the_extender_evicts_only_the_offline_class_and_those_listed(default):
    def preemptible(objects: list[dict]) -> tuple[tuple[str, ...], bool]:
        data = one(objects, "ConfigMap", "-scheduler")["data"]
        ext = parse_settings(yaml.safe_load(data["extender.yaml"]), EXTENDER_SETTINGS)
        return ext["preemptible_classes"], ext["preempt_pods_without_class"]

    assert preemptible(default) == (("infergrid-offline",), False)
    listed = render(
        "--set", "scheduler.extender.preemptibleClasses={batch-low,infergrid-offline}",
        "--set", "scheduler.extender.preemptPodsWithoutClass=true",
    )  # fmt: skip
    assert preemptible(listed) == (("infergrid-offline", "batch-low"), True)
    # Its admission policy lets it delete (a budget's fallback) only those classes' pods.
    assert cel_literal(one(default, "ValidatingAdmissionPolicy", "-extender"), "preemptible") == [
        "infergrid-offline"
    ]
    policy = one(listed, "ValidatingAdmissionPolicy", "-extender")
    assert cel_literal(policy, "preemptible") == ["infergrid-offline", "batch-low", ""]


def test_the_extenders_default_preemptible_class_is_the_charts_offline_class():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert DEFAULT_PREEMPTIBLE == {values["priorityClasses"]["offline"]["name"]}


@needs_helm
def test_a_system_class_is_never_preemptible():
    done = helm(
        "template", "ig", str(CHART), "--kube-version", KUBE_VERSION,
        "--set", "scheduler.extender.preemptibleClasses={system-node-critical}",
    )  # fmt: skip
    assert done.returncode != 0 and "preemptibleClasses" in done.stderr


@needs_helm
def test_the_extenders_evictions_and_deletions_are_both_under_its_policy(default):
    """RBAC gives it pods/eviction create and pods delete; its policy covers both."""
    rules = rules_of(default, "ClusterRole", "-extender")
    assert {("", "pods/eviction", "create"), ("", "pods", "delete")} <= rules
    policy = one(default, "ValidatingAdmissionPolicy", "-extender")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert {"pods", "pods/eviction"} <= set(rule["resources"])
    assert {"CREATE", "DELETE"} <= set(rule["operations"])
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert "preconditions.?uid" in variables["evictsOneUid"]
    assert "variables.preemptible" in variables["deletesGpuHolder"]


# Who may call the engines (operator/inference_operator/engine_access.py): the engine token
# key, mounted into the operator and the gateway only, and the NetworkPolicies.

KEYED = ("--set", "gateway.apiKeysSecret.name=tenant-keys")


def operator_config(objects: list[dict]) -> dict:
    doc = yaml.safe_load(one(objects, "ConfigMap", "-operator")["data"]["operator.yaml"])
    return parse_settings(doc, OPERATOR_SETTINGS)


def mounts_of(workload: dict, secret: str) -> list[str]:
    """Where the workload's containers mount the Secret `secret`."""
    spec = pod_spec(workload)
    volumes = {v["name"] for v in spec.get("volumes", []) if
               v.get("secret", {}).get("secretName") == secret}  # fmt: skip
    return [m["mountPath"] for c in spec["containers"] for m in c.get("volumeMounts", [])
            if m["name"] in volumes]  # fmt: skip


@needs_helm
def test_only_the_operator_and_the_gateway_hold_the_engine_token_key():
    objects = render(*KEYED)
    secret = one(objects, "Secret", "-engine-auth")
    assert len(base64.b64decode(secret["data"]["key"])) >= 32
    name = secret["metadata"]["name"]
    holders = {w["metadata"]["name"]: mounts_of(w, name)
               for w in by_kind(objects, "Deployment") + by_kind(objects, "DaemonSet")}  # fmt: skip
    assert {w for w, paths in holders.items() if paths} == {"ig-infergrid-operator",
                                                            "ig-infergrid-gateway"}  # fmt: skip
    (operator_dir,) = holders["ig-infergrid-operator"]
    (gateway_dir,) = holders["ig-infergrid-gateway"]
    assert operator_config(objects)["engine_token_key_file"] == f"{operator_dir}/key"
    assert gateway_config(objects).engine_token_key_file == f"{gateway_dir}/key"


@needs_helm
def test_an_existing_key_secret_is_mounted_and_none_is_made():
    objects = render(*KEYED, "--set", "engineAuth.existingSecret=my-key")
    assert not [s for s in by_kind(objects, "Secret") if s["metadata"]["name"].endswith("-auth")]
    assert mounts_of(one(objects, "Deployment", "-gateway"), "my-key")
    assert mounts_of(one(objects, "Deployment", "-operator"), "my-key")


@needs_helm
def test_without_engine_auth_no_key_exists_and_the_operator_writes_no_secret():
    objects = render(*KEYED, "--set", "engineAuth.enabled=false")
    assert not by_kind(objects, "Secret")
    assert operator_config(objects).get("engine_token_key_file", "") == ""
    assert gateway_config(objects).engine_token_key_file == ""
    assert not {r for r in rules_of(objects, "ClusterRole", "-operator") if r[1] == "secrets"}


@needs_helm
def test_the_operator_fences_engines_from_all_but_the_gateway_and_itself():
    objects = render(*KEYED, "--set", "networkPolicy.engineIngressCidrs={192.168.1.0/24}")
    config = operator_config(objects)
    assert config["engine_network_policy"] is True
    assert config["engine_ingress_cidrs"] == ("192.168.1.0/24",)
    templates = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
                 for d in by_kind(objects, "Deployment")}  # fmt: skip
    selected = {
        name
        for caller in config["engine_callers"]
        for name, labels in templates.items()
        if caller.namespace == NAMESPACE and dict(caller.pod_labels).items() <= labels.items()
    }
    assert selected == {"ig-infergrid-operator", "ig-infergrid-gateway"}
    rules = rules_of(objects, "ClusterRole", "-operator")
    assert {r for r in rules if r[1] in ("networkpolicies", "secrets")} == {
        ("networking.k8s.io", "networkpolicies", verb) for verb in ("get", "create", "patch")
    } | {("", "secrets", verb) for verb in ("get", "create", "patch")}
    objects = render(*KEYED, "--set", "networkPolicy.engines=false")
    assert operator_config(objects)["engine_network_policy"] is False
    assert not {
        r for r in rules_of(objects, "ClusterRole", "-operator") if r[2] == "networkpolicies"
    }


@needs_helm
def test_the_gateways_metrics_are_reachable_only_from_the_operator_and_the_listed_peers():
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}
    objects = render(*KEYED, "--set-json",
                     f"networkPolicy.gatewayMetricsFrom=[{json.dumps(prometheus)}]")  # fmt: skip
    policy = one(objects, "NetworkPolicy", "-gateway")
    gateway = one(objects, "Deployment", "-gateway")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= (
        gateway["spec"]["template"]["metadata"]["labels"].items()
    )
    ports = {p["name"] for p in pod_spec(gateway)["containers"][0]["ports"]}
    api, metrics = policy["spec"]["ingress"]
    assert api == {"ports": [{"port": "http", "protocol": "TCP"}]}  # every client: keys guard it
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert {"http", "metrics"} <= ports
    operator = one(objects, "Deployment", "-operator")["spec"]["template"]["metadata"]["labels"]
    first, second = metrics["from"]
    assert first["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name":
                                                          NAMESPACE}}  # fmt: skip
    assert first["podSelector"]["matchLabels"].items() <= operator.items()
    assert second == prometheus
    # With no operator and no peer listed, nothing reaches /metrics (never a rule without from).
    objects = render(*KEYED, "--set", "operator.enabled=false")
    assert one(objects, "NetworkPolicy", "-gateway")["spec"]["ingress"] == [api]


ENGINE_ACCESS_INVALID = [
    (["--set", "networkPolicy.engineIngressCidrs={10.0.0.1}"],
     "/networkPolicy/engineIngressCidrs/0"),
    (["--set-json", 'networkPolicy.engineCallers=[{"namespace":"a"}]'],
     "/networkPolicy/engineCallers/0"),
    (["--set-json", "networkPolicy.gatewayMetricsFrom=[{}]"],
     "/networkPolicy/gatewayMetricsFrom/0"),
    (["--set", "engineAuth.existingSecret=My_Key"], "/engineAuth/existingSecret"),
]  # fmt: skip


@needs_helm
@pytest.mark.parametrize(("args", "message"), ENGINE_ACCESS_INVALID,
                         ids=[m for _, m in ENGINE_ACCESS_INVALID])  # fmt: skip
def test_bad_engine_access_values_are_rejected_naming_the_key(args, message):
    done = helm("template", "ig", str(CHART), "--kube-version", KUBE_VERSION, *KEYED, *args)
    assert done.returncode != 0, f"{args} was accepted"
    assert message in done.stderr, done.stderr


# The gateway's keys: required unless the installer opens it in so many words.

OPEN_GATEWAY = ("--set", "gateway.allowAnonymous=true", "--set", "gateway.apiKeysSecret.name=")


def notes(tmp_path: Path, *args: str) -> str:
    """NOTES.txt as `helm install` prints it, rendered without a cluster: a copy of the chart
    whose notes are also a template of a ConfigMap."""
    chart = tmp_path / "infergrid"
    shutil.copytree(CHART, chart)
    text = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes.tpl").write_text(
        f'{{{{- define "notes" -}}}}{text}{{{{- end }}}}'
    )
    (chart / "templates" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data:\n  notes: {{ include "notes" . | toJson }}\n'
    )
    done = helm("template", "ig", str(chart), "--namespace", NAMESPACE, "--kube-version",
                KUBE_VERSION, "--show-only", "templates/notes.yaml", *args)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)["data"]["notes"]


@needs_helm
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--set", "gateway.apiKeysSecret.name="),
         "gateway.apiKeysSecret.name is empty: name the Secret of API keys"),
        (("--set", "gateway.allowAnonymous=true"),
         "gateway.allowAnonymous=true contradicts gateway.apiKeysSecret.name="),
    ],
    ids=["no-keys", "anonymous-with-keys"],
)  # fmt: skip
def test_a_gateway_without_keys_is_refused_unless_anonymous_callers_are_allowed(args, message):
    done = helm("template", "ig", str(CHART), "--kube-version", KUBE_VERSION, *args)
    assert done.returncode != 0, f"{args} was accepted"
    assert message in done.stderr, done.stderr
    # Without a gateway there is nothing to key.
    assert render("--set", "gateway.enabled=false", *args)


@needs_helm
def test_an_open_gateway_is_bounded_and_says_so_loudly(tmp_path):
    objects = render(*OPEN_GATEWAY, "--set", "gateway.anonymous.maxScaleFromZero=0",
                     "--set", "gateway.anonymous.namespaces={demo}")  # fmt: skip
    cfg = gateway_config(objects)
    assert cfg.secret is None and cfg.allow_anonymous is True
    assert cfg.anonymous == TenantLimits("anonymous", 20.0, 40.0, 200000.0, 32,
                                         frozenset({"demo"}), 0)  # fmt: skip
    assert not [r for r in by_kind(objects, "Role") if "-gateway" in r["metadata"]["name"]]
    opened = notes(tmp_path / "open", *OPEN_GATEWAY)
    assert "WARNING: the gateway accepts UNAUTHENTICATED callers" in opened
    keyed = notes(tmp_path / "keyed")
    assert "UNAUTHENTICATED" not in keyed
    assert f"Every request needs a key of Secret {NAMESPACE}/infergrid-gateway-keys" in keyed


@needs_helm
@pytest.mark.parametrize(
    ("args", "where"),
    [
        (("--set", "gateway.anonymous.maxConcurrent=0"), "/gateway/anonymous/maxConcurrent"),
        (("--set", "gateway.anonymous.tokensPerMinute=1.5"), "/gateway/anonymous/tokensPerMinute"),
        (("--set", "gateway.anonymous.rps=5"), "additional properties 'rps'"),
        (("--set", "gateway.allowAnonymous=yes"), "/gateway/allowAnonymous"),
    ],
)  # fmt: skip
def test_bad_anonymous_values_are_rejected_naming_the_key(args, where):
    done = helm("template", "ig", str(CHART), "--kube-version", KUBE_VERSION, *OPEN_GATEWAY, *args)
    assert done.returncode != 0, f"{args} was accepted"
    assert where in done.stderr, done.stderr


DRA_POOL = ["--set-json", "nodePools=" + json.dumps([
    {"name": "gpu", "nodeSelector": {}, "mode": "devicePlugin"},
    {"name": "dra", "nodeSelector": {"infergrid.io/pool": "dra"}, "mode": "dra"},
])]  # fmt: skip


@pytest.fixture(scope="module")
def with_dra_pool() -> list[dict]:
    if not HELM.exists():
        pytest.skip(f"helm is not built ({HELM}); run `make cluster-build`")
    return render(*DRA_POOL)


def node_terms(daemonset: dict) -> list[dict]:
    affinity = pod_spec(daemonset)["affinity"]["nodeAffinity"]
    return affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


def test_by_default_every_gpu_node_is_a_device_plugin_node_and_nothing_of_dra_renders(default):
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["nodePools"] == [{"name": "gpu", "nodeSelector": {}, "mode": "devicePlugin"}]
    plugin = one(default, "DaemonSet", "-device-plugin")
    assert node_terms(plugin) == values["devicePlugin"]["gpuNodeSelectorTerms"]
    assert not by_kind(default, "DeviceClass")
    assert not [o for o in default if "dra-driver" in o["metadata"]["name"]]


def test_a_dra_pool_gets_the_dra_driver_and_the_device_plugin_leaves_it(with_dra_pool):
    """A node is in one mode: the plugin's terms exclude the pool, the driver's select it."""
    gpu_terms = yaml.safe_load((CHART / "values.yaml").read_text())["devicePlugin"][
        "gpuNodeSelectorTerms"
    ]
    pool = {"key": "infergrid.io/pool", "values": ["dra"]}
    plugin = node_terms(one(with_dra_pool, "DaemonSet", "-device-plugin"))
    driver = node_terms(one(with_dra_pool, "DaemonSet", "-dra-driver"))
    assert plugin == [{"matchExpressions": [*t["matchExpressions"], {**pool, "operator": "NotIn"}]}
                      for t in gpu_terms]  # fmt: skip
    assert driver == [{"matchExpressions": [*t["matchExpressions"], {**pool, "operator": "In"}]}
                      for t in gpu_terms]  # fmt: skip


def test_the_dra_driver_runs_as_pinned_with_the_kubelets_and_cdi_folders(with_dra_pool):
    daemonset = one(with_dra_pool, "DaemonSet", "-dra-driver")
    (driver,) = pod_spec(daemonset)["containers"]
    assert driver["command"] == ["infergrid-dra-driver", "--config",
                                 "/etc/infergrid/dra-driver.yaml"]  # fmt: skip
    assert driver["image"] == one(with_dra_pool, "DaemonSet", "-device-plugin")["spec"][
        "template"]["spec"]["containers"][0]["image"]  # fmt: skip
    env = {e["name"]: e for e in driver["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    paths = {v["name"]: v["hostPath"]["path"] for v in pod_spec(daemonset)["volumes"]
             if "hostPath" in v}  # fmt: skip
    assert set(paths.values()) == {"/var/lib/kubelet/plugins",
                                   "/var/lib/kubelet/plugins_registry", "/var/run/cdi"}  # fmt: skip
    config = yaml.safe_load(
        one(with_dra_pool, "ConfigMap", "-dra-driver")["data"]["dra-driver.yaml"]
    )
    assert config == {"version": "v1", "pluginDir": "/var/lib/kubelet/plugins/gpu.infergrid.io",
                      "registryDir": "/var/lib/kubelet/plugins_registry",
                      "cdiDir": "/var/run/cdi", "mps": False, "mpsRoot": "/run/infergrid/mps",
                      "metricsPort": 0}  # fmt: skip
    driver_role = rules_of(with_dra_pool, "ClusterRole", "-dra-driver")
    slices = {("resource.k8s.io", "resourceslices", v)
              for v in ("get", "list", "watch", "create", "update", "patch", "delete")}  # fmt: skip
    assert driver_role == slices | {("resource.k8s.io", "resourceclaims", "get"),
                                    ("", "nodes", "get")}  # fmt: skip
    check_rbac(with_dra_pool)
    check_labels(with_dra_pool)


def test_with_mps_and_a_fake_fleet_the_dra_driver_runs_the_mps_daemons_on_the_fleet():
    objects = render(*DRA_POOL, "--set", "devicePlugin.config.mps=true",
                     "--set", "devicePlugin.fakeFleet=nodes: []")  # fmt: skip
    daemonset = one(objects, "DaemonSet", "-dra-driver")
    containers = {c["name"]: c for c in pod_spec(daemonset)["containers"]}
    assert containers["mps-control-daemon"]["command"] == ["infergrid-mps-daemon"]
    mounts = {m["mountPath"] for m in containers["dra-driver"]["volumeMounts"]}
    assert "/run/infergrid/mps" in mounts
    data = one(objects, "ConfigMap", "-dra-driver")["data"]
    assert yaml.safe_load(data["dra-driver.yaml"])["fakeFleet"] == "/etc/infergrid/fleet.yaml"
    assert data["fleet.yaml"].strip() == "nodes: []"
    assert yaml.safe_load(data["device-plugin.yaml"])["mps"] is True


def test_the_device_classes_are_the_contracts(with_dra_pool):
    classes = {
        c["metadata"]["name"]: c["spec"]["selectors"] for c in by_kind(with_dra_pool, "DeviceClass")
    }
    assert set(classes) == {dra.CLASS_GPU, dra.CLASS_SHARE, dra.CLASS_MIG}
    for name, kind in ((dra.CLASS_GPU, dra.TYPE_GPU), (dra.CLASS_SHARE, dra.TYPE_GPU),
                       (dra.CLASS_MIG, dra.TYPE_MIG)):  # fmt: skip
        expression = (f'device.driver == "{dra.DRIVER}" && '
                      f'device.attributes["{dra.DRIVER}"].{dra.ATTR_TYPE} == "{kind}"')  # fmt: skip
        assert classes[name] == [{"cel": {"expression": expression}}]


def test_the_claim_marker_is_ignored_by_kube_scheduler():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    managed = {r["name"]: r["ignoredByScheduler"] for r in values["scheduler"]["managedResources"]}
    assert managed[dra.RESOURCE_GPU_CLAIM] is True


def test_the_dra_driver_may_set_the_gpu_env_the_admission_policy_forbids_others(with_dra_pool):
    policy = one(with_dra_pool, "ValidatingAdmissionPolicy", "-gpu-env")
    (condition,) = policy["spec"]["matchConditions"]
    assert "'ig-infergrid-dra-driver'" in condition["expression"]


@pytest.mark.parametrize(
    ("pools", "message"),
    [
        ([{"name": "a", "nodeSelector": {}, "mode": "dra"}], "nodePools a: a dra pool needs"),
        ([{"name": "a", "nodeSelector": {"k": "v"}, "mode": "devicePlugin"},
          {"name": "b", "nodeSelector": {"k": "v"}, "mode": "dra"}],
         "nodePools b: its nodeSelector is the same as pool a's"),
        ([{"name": "a", "nodeSelector": {}, "mode": "devicePlugin"},
          {"name": "a", "nodeSelector": {"k": "v"}, "mode": "dra"}],
         "nodePools: the name a is used twice"),
        ([{"name": "a", "nodeSelector": {}, "mode": "kubelet"}], "nodePools/0/mode"),
    ],
)  # fmt: skip
@needs_helm
def test_bad_node_pools_are_rejected_naming_the_pool(tmp_path, pools, message):
    values = tmp_path / "pools.yaml"
    values.write_text(yaml.safe_dump({"nodePools": pools}))
    done = helm("template", "ig", str(CHART), "--kube-version", KUBE_VERSION, "-f", str(values))
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_kube_scheduler_takes_the_feature_gates_dra_mode_needs():
    def scheduler_args(*args: str) -> list[str]:
        deployment = one(render(*args), "Deployment", "-scheduler")
        (kube_scheduler,) = [c for c in pod_spec(deployment)["containers"]
                             if c["name"] == "kube-scheduler"]  # fmt: skip
        return kube_scheduler["args"]

    assert not [a for a in scheduler_args() if a.startswith("--feature-gates")]
    gates = "--feature-gates=DRAConsumableCapacity=true,DRAPartitionableDevices=false"
    assert gates in scheduler_args(
        "--set", "scheduler.kubeScheduler.featureGates.DRAPartitionableDevices=false",
        "--set", "scheduler.kubeScheduler.featureGates.DRAConsumableCapacity=true",
    )  # fmt: skip
