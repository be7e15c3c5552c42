"""What the local cluster runs, read without starting it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml

from e2e.cluster import certs, components, prometheus
from images import cluster_binaries
from infergrid import constants


def layout(tmp_path: Path) -> components.Layout:
    return components.Layout(
        tmp_path,
        certs.generate(tmp_path / "certs"),
        cluster_binaries.paths(),
        *range(20001, 20008),
        "http://127.0.0.1:8888/",
    )


def test_infergrid_scheduler_is_its_own_profile_bound_to_the_extender(tmp_path):
    config = yaml.safe_load(components.infergrid_scheduler_config(layout(tmp_path)))
    assert [p["schedulerName"] for p in config["profiles"]] == [constants.SCHEDULER_NAME]
    assert config["percentageOfNodesToScore"] == 100
    # The pod's placement policy decides: no stock scorer with a placement policy of its own.
    (profile,) = config["profiles"]
    disabled = {p["name"] for p in profile["plugins"]["score"]["disabled"]}
    assert disabled == {"NodeResourcesFit", "NodeResourcesBalancedAllocation"}
    (spread,) = profile["pluginConfig"]
    assert spread == {"name": "PodTopologySpread",
                      "args": {"defaultingType": "List", "defaultConstraints": []}}  # fmt: skip
    (extender,) = config["extenders"]
    assert extender["nodeCacheCapable"] is True
    assert extender["bindVerb"] == "bind"
    managed = {r["name"]: r["ignoredByScheduler"] for r in extender["managedResources"]}
    assert managed[constants.RESOURCE_GPU] is False
    assert managed[constants.RESOURCE_VGPU] is False
    assert managed[constants.RESOURCE_GPU_MEMORY] is True
    assert managed[constants.RESOURCE_GPU_CORES] is True
    assert constants.mig_resource("1g.10gb") in managed


def test_kubeconfig_inlines_admin_credentials(tmp_path):
    lay = layout(tmp_path)
    kc = yaml.safe_load(components.kubeconfig(lay))
    assert kc["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:20003"
    user = kc["users"][0]["user"]
    assert user["client-certificate-data"] and user["client-key-data"]


def test_admin_certificate_is_in_system_masters(tmp_path):
    from cryptography import x509

    paths = certs.generate(tmp_path)
    cert = x509.load_pem_x509_certificate(paths.admin_cert.read_bytes())
    orgs = [a.value for a in cert.subject.get_attributes_for_oid(x509.NameOID.ORGANIZATION_NAME)]
    assert orgs == ["system:masters"]
    server = x509.load_pem_x509_certificate(paths.server_cert.read_bytes())
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]


def test_apiserver_runs_offline_on_loopback(tmp_path):
    argv = components.commands(layout(tmp_path))["kube-apiserver"]
    assert "--advertise-address=127.0.0.1" in argv
    assert "--endpoint-reconciler-type=none" in argv
    assert "--bind-address=127.0.0.1" in argv


def test_every_process_listens_on_loopback_only(tmp_path):
    for name, argv in components.commands(layout(tmp_path)).items():
        addresses = [a for a in argv if "address=" in a or "urls=" in a]
        assert addresses, name
        assert all("127.0.0.1" in a for a in addresses), name


def test_pinned_versions_key_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERGRID_CACHE", str(tmp_path))
    found = cluster_binaries.paths()
    v = cluster_binaries.versions()
    assert found["kube-apiserver"].parent.name == f"kubernetes-{v['K8S_VERSION']}"
    assert found["etcd"].is_relative_to(tmp_path)


def test_prometheus_scrapes_the_plugins_engines_and_parts_keeping_the_plugins_pod_labels(
    tmp_path,
):
    """The local cluster's Prometheus: the plugins run here from the file the cluster writes,
    the engines and the chart's parts from the files the targets loop writes; the plugin's
    own pod and namespace labels (the holders of each GPU) win over the target's."""
    folder = tmp_path / "prometheus"
    path = prometheus.write_config(folder, {"h100-0": 31001, "t4-0": 31002})
    jobs = {job["job_name"]: job for job in yaml.safe_load(path.read_text())["scrape_configs"]}
    assert {name: job["honor_labels"] for name, job in jobs.items()} == {
        "device-plugin": True, "engines": False, "infergrid": True,
    }  # fmt: skip
    targets = json.loads((folder / "device-plugins.json").read_text())
    assert targets == [
        {"labels": {"node": "h100-0"}, "targets": ["127.0.0.1:31001"]},
        {"labels": {"node": "t4-0"}, "targets": ["127.0.0.1:31002"]},
    ]
    argv = prometheus.command("prometheus", path, folder, 9090)
    assert "--web.listen-address=127.0.0.1:9090" in argv  # loopback only
    promtool = shutil.which("promtool")
    if promtool:  # Debian's prometheus package brings it: the file is one Prometheus takes
        check = subprocess.run([promtool, "check", "config", str(path)], capture_output=True)
        assert check.returncode == 0, check.stdout + check.stderr


def pod(name: str, labels: dict, ports: list, phase: str = "Running", ip: str = "10.0.0.9"):
    return {
        "metadata": {"name": name, "namespace": "demo", "labels": labels},
        "spec": {"nodeName": "local-l4", "containers": [{"ports": ports}]},
        "status": {"phase": phase, "podIP": ip},
    }


def test_the_targets_are_the_running_engines_and_parts_on_the_ports_they_serve_metrics():
    service = {"infergrid.io/inferenceservice": "chat", "infergrid.io/track": "stable"}
    engine = pod("chat-0", service, [{"name": "http", "containerPort": 8080}])
    plugin = pod("dp", {"app.kubernetes.io/name": "infergrid",
                        "app.kubernetes.io/component": "device-plugin"},
                 [{"name": "metrics", "containerPort": 9400}], ip="10.0.0.2")  # fmt: skip
    extender = pod("sched", {"app.kubernetes.io/name": "infergrid",
                             "app.kubernetes.io/component": "scheduler"},
                   [{"name": "http", "containerPort": 8888}], ip="10.0.0.3")  # fmt: skip
    pending = pod("chat-1", {"infergrid.io/inferenceservice": "chat"},
                  [{"name": "http", "containerPort": 8000}], phase="Pending", ip="")  # fmt: skip
    other = pod("web", {"app": "web"}, [{"name": "http", "containerPort": 80}])
    found = prometheus.pod_targets([engine, plugin, extender, pending, other])
    assert found["engines"] == [{
        "targets": ["10.0.0.9:8080"],
        "labels": {"namespace": "demo", "pod": "chat-0", "node": "local-l4",
                   "inferenceservice": "chat", "track": "stable"},
    }]  # fmt: skip
    assert [g["targets"] for g in found["infergrid"]] == [["10.0.0.2:9400"], ["10.0.0.3:8888"]]
    assert [g["labels"]["component"] for g in found["infergrid"]] == ["device-plugin", "scheduler"]
