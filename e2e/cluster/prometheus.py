"""A Prometheus beside the local cluster, so `infergrid report` has the cluster's own metrics.

`make cluster-up PROMETHEUS=1` (and the demo, always) starts Debian's `prometheus` on
127.0.0.1, storing under the cluster's state folder, scraping every few seconds:
- the device plugins that run as processes here (the KWOK nodes'), from a target file the
  cluster writes as it starts them;
- the engines (pods of an InferenceService, on their `http` port, labelled with the
  service and track) and the chart's parts (their `metrics` port; the extender's `http`),
  with their namespace, pod and node, from target files that `targets_loop` rewrites as
  pods come and go. Debian builds Prometheus without Kubernetes discovery, so this small
  process, beside the cluster like KWOK, lists the pods instead.
The device plugin names the pods that hold each GPU in its own `namespace` and `pod` labels,
so the plugins' jobs honour a target's labels. Everything but the loop is pure.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import yaml

SCRAPE_INTERVAL_S: Final = 5
# job -> (its target file, whether the target's own labels win over Prometheus')
JOBS: Final = {
    "device-plugin": ("device-plugins.json", True),
    "engines": ("engines.json", False),
    "infergrid": ("parts.json", True),
}
LABEL_SERVICE: Final = "infergrid.io/inferenceservice"
LABEL_TRACK: Final = "infergrid.io/track"


def config(folder: Path) -> dict[str, Any]:
    """The scrape configuration: one job per target file in `folder`."""
    return {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
            "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
        },
        "scrape_configs": [
            {
                "job_name": job,
                "honor_labels": honor,
                "file_sd_configs": [{"files": [str(folder / file)], "refresh_interval": "5s"}],
            }
            for job, (file, honor) in JOBS.items()
        ],
    }


def plugin_targets(ports: Mapping[str, int]) -> list[dict[str, Any]]:
    """The device plugins run here: node name -> metrics port on this machine."""
    return [
        {"targets": [f"127.0.0.1:{port}"], "labels": {"node": node}}
        for node, port in sorted(ports.items())
    ]


def pod_targets(pods: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Target groups by job from pods as the API server lists them (JSON): each running pod
    with an IP, on the port its job scrapes."""
    found: dict[str, list[dict[str, Any]]] = {"engines": [], "infergrid": []}
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if status.get("phase") != "Running" or not status.get("podIP"):
            continue
        labels = meta.get("labels") or {}
        common = {
            "namespace": meta.get("namespace", ""),
            "pod": meta.get("name", ""),
            "node": (pod.get("spec") or {}).get("nodeName", ""),
        }
        if LABEL_SERVICE in labels:
            job, port_name = "engines", "http"
            common |= {"inferenceservice": labels[LABEL_SERVICE],
                       "track": labels.get(LABEL_TRACK, "")}  # fmt: skip
        elif labels.get("app.kubernetes.io/name") == "infergrid":
            component = labels.get("app.kubernetes.io/component", "")
            job, port_name = "infergrid", "http" if component == "scheduler" else "metrics"
            common["component"] = component
        else:
            continue
        port = _port(pod, port_name)
        if port is not None:
            found[job].append({"targets": [f"{status['podIP']}:{port}"], "labels": common})
    return found


def write_config(folder: Path, plugin_ports: Mapping[str, int]) -> Path:
    """The config and the plugins' target file in `folder` (the pods' start empty)."""
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / JOBS["device-plugin"][0], plugin_targets(plugin_ports))
    for job in ("engines", "infergrid"):
        _write_json(folder / JOBS[job][0], [])
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(config(folder), sort_keys=False))
    return path


def command(binary: str, config_file: Path, folder: Path, port: int) -> list[str]:
    """Prometheus on 127.0.0.1:`port`, its data under `folder`, kept for a day."""
    return [
        binary,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={folder / 'data'}",
        "--storage.tsdb.retention.time=1d",
        f"--web.listen-address=127.0.0.1:{port}",
    ]


def targets_loop(kubeconfig: Path, folder: Path, interval_s: float = 3.0) -> None:
    """Rewrites the pods' target files while the cluster runs (`python -m
    e2e.cluster.prometheus KUBECONFIG FOLDER`); a failed listing keeps the files as they are."""
    from kubernetes import client, config

    core = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
    while True:
        try:
            listed = core.list_pod_for_all_namespaces(_preload_content=False, _request_timeout=10)
            pods = json.loads(listed.data).get("items") or []
        except Exception:  # noqa: BLE001 - the API server restarting: try again next round
            pods = None
        if pods is not None:
            for job, groups in pod_targets(pods).items():
                _write_json(folder / JOBS[job][0], groups)
        time.sleep(interval_s)


def _port(pod: dict[str, Any], name: str) -> int | None:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == name and port.get("containerPort"):
                return int(port["containerPort"])
    return None


def _write_json(path: Path, value: object) -> None:
    """Written whole and renamed, so Prometheus never reads half a file; unchanged: untouched."""
    text = json.dumps(value, indent=1, sort_keys=True)
    if path.exists() and path.read_text() == text:
        return
    staging = path.with_name(f".{path.name}.new")
    staging.write_text(text)
    staging.replace(path)


if __name__ == "__main__":
    import sys

    targets_loop(Path(sys.argv[1]), Path(sys.argv[2]))
