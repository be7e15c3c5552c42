"""`make demo`: InferGrid end to end on this machine, in one command.

The system runs as users install it: `helm install` of the chart puts the operator,
infergrid-scheduler with the extender, the gateway and the real node's device plugin in pods
on the real node, from the images built here, each with its own ServiceAccount and the
chart's admission policies. Only the KWOK fleet's device plugins run as processes on fake
NVML: they stand for hardware, and KWOK nodes start no containers.

    python -m e2e.demo [--keep] [--quick]     # run it (make demo, make demo KEEP=1)
    python -m e2e.demo down                   # stop what --keep left running

Each step says what it does and how long it took. A failing step names itself
and the log to read, and everything started so far is stopped (unless --keep).
The cluster lives in `.demo/` (its own state folder), so a cluster from
`make cluster-up` is left alone.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from e2e.cluster import model_store
from e2e.cluster.local_cluster import REPO, LocalCluster
from e2e.cluster.node_images import LOCAL_VALUES, chart_args
from e2e.cluster.processes import ClusterError, wait_until
from e2e.cluster.prometheus import SCRAPE_INTERVAL_S
from e2e.operator_support import (
    SAMPLES,
    container_statuses,
    create_service,
    kubectl,
    on_kwok,
    owned,
)
from images import cluster_binaries
from images.build import build as build_images
from infergrid import placement_table
from infergrid.cluster_snapshot import Snapshot, list_objects, read_snapshot
from infergrid.constants import PLACEMENT_POLICIES
from infergrid.report import render_html, render_table, report_from_prometheus
from infergrid.simulate.policies import parse_policies
from infergrid.what_if import report as what_if_report
from infergrid.what_if import what_if

STATE = REPO / ".demo"
FLEET = REPO / "e2e" / "fleets" / "demo.yaml"
NAMESPACE = "fleet"  # the samples placed on the KWOK fleet
SERVING = "demo"  # the InferenceService served from a pod on the real node
SAMPLE_FILES = ("smollm2-whole-gpu.yaml", "embeddings-mig.yaml", "smollm2-shared.yaml",
                "smollm2-canary.yaml")  # fmt: skip
"""A whole-GPU model read from a claim, a MIG embedding model, and shared-GPU small models
(one with a canary), applied one after the other so each lands on what the ones before left."""
SERVED = SAMPLES / "smollm2-shared.yaml"
SERVED_NAME = "smollm2"
PROMPTS = (
    "What is a GPU? Answer in one sentence.",
    "Name three colours of the rainbow.",
)
STALE_AFTER = timedelta(seconds=60)
REPORT_STEP_S = float(SCRAPE_INTERVAL_S)  # a sample per scrape of the cluster's Prometheus
RELEASE = "infergrid"  # helm install infergrid ... (the chart's names then start infergrid-)
RELEASE_NAMESPACE = "infergrid-system"
CHART = REPO / "deploy" / "helm" / "infergrid"
INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"


class StepFailed(Exception):
    def __init__(self, message: str, log: Path | None = None):
        super().__init__(message)
        self.log = log


@dataclass
class Demo:
    keep: bool = False
    quick: bool = False
    state: Path = STATE
    out: Callable[[str], None] = print
    cluster: LocalCluster = field(init=False)
    engine_url: str = ""  # the engine pod's own port (its /metrics)
    gateway_url: str = ""  # the gateway's OpenAI API, what users call
    gateway_metrics: str = ""
    started_at: float = 0.0  # when the cluster came up: the report's window starts there

    def __post_init__(self) -> None:
        self.cluster = LocalCluster(self.state)

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    def steps(self) -> list[tuple[str, Callable[[], None]]]:
        return [
            ("cluster binaries (built once from pinned Go modules, then cached)", self.binaries),
            ("images built here, no registry (first run: minutes, then cached)", self.images),
            ("local cluster: a real node, and a KWOK fleet of H100 NVLink, A100 MIG, T4",
             self.up),
            ("helm install: operator, infergrid-scheduler with the extender, gateway and the"
             " real node's device plugin, in pods on the real node", self.chart),
            ("sample InferenceServices placed on the KWOK fleet by infergrid-scheduler",
             self.services),
            ("placement per GPU, as the API server holds it", self.placements),
            ("infergrid what-if: these pods replayed under each policy, and what a re-pack"
             " would free (nothing moves)", self.what_if),
            ("SmolLM2 served from a pod on the real node: kubectl apply, then chat through the"
             " gateway", self.engine),
            ("live metrics of that pod and of the gateway", self.metrics),
            ("infergrid report of this run, from the cluster's Prometheus: GPU-hours held with"
             " shares against whole GPUs", self.report),
        ]  # fmt: skip

    def run(self) -> int:
        started = time.monotonic()
        steps = self.steps()
        for n, (title, step) in enumerate(steps, 1):
            self.out(f"\n[{n}/{len(steps) + 1}] {title}")
            t0 = time.monotonic()
            try:
                step()
            except (StepFailed, ClusterError, OSError, RuntimeError, TimeoutError) as err:
                log = getattr(err, "log", None) or self.logs
                self.out(f"\nstep {n} failed ({title}): {err}\n  logs: {log}")
                if not self.keep:
                    self.down()
                return 1
            self.out(f"    done in {time.monotonic() - t0:.1f}s")
        last = f"\n[{len(steps) + 1}/{len(steps) + 1}]"
        if self.keep:
            self.out(f"{last} everything stays up; to reach it:")
            self.out(self.how_to_reach())
        else:
            self.out(f"{last} cleaning up: stopped {len(self.down())} processes")
        self.out(f"\ndemo finished in {time.monotonic() - started:.0f}s")
        return 0

    # The steps.

    def binaries(self) -> None:
        cluster_binaries.ensure_built()

    def images(self) -> None:
        try:
            built = build_images()
        except SystemExit as err:  # the builder's message names what is missing
            raise StepFailed(f"building the images failed: {err}") from None
        fresh = sum(image.seconds for image in built.values())
        self.out(f"    {len(built)} images ready ({fresh:.0f}s spent building in this run)")

    def up(self) -> None:
        if self.cluster.is_running():
            self.down()
        seconds = self.cluster.up(FLEET, for_chart=True, prometheus=True)
        self.started_at = time.time()
        self.out(f"    control plane, a real node (kubelet + containerd), KWOK nodes with a"
                 f" fake-NVML device plugin each, up in {seconds:.1f}s")  # fmt: skip

    def chart(self) -> None:
        """The install of docs/install.md: the chart's own identities, RBAC and admission policies.
        The operator's rights are Roles in the namespaces it serves, so those come first."""
        core = client.CoreV1Api(self.cluster.api())
        for namespace in (NAMESPACE, SERVING):
            core.create_namespace({"metadata": {"name": namespace}})
        argv = [str(cluster_binaries.paths()["helm"]), "--kubeconfig", str(self.cluster.kubeconfig),
                "install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE,
                "--create-namespace", *chart_args(LOCAL_VALUES, FLEET),
                "--set", f"operator.watchNamespaces={{{NAMESPACE},{SERVING}}}",
                "--set", f"gateway.watchNamespaces={{{SERVING}}}",
                "--wait", "--timeout", "300s"]  # fmt: skip
        self.out(f"    helm install {RELEASE} deploy/helm/infergrid -n {RELEASE_NAMESPACE}"
                 " $(python -m e2e.cluster helm-args) ...")  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=360, check=False)
        if done.returncode != 0:
            raise StepFailed(f"helm install failed: {done.stderr.strip()}\n"
                             f"{_indent(self._release_state())}")  # fmt: skip
        wait_until(self._release_ready, 180, "every pod of the release Ready",
                   on_poll=self._check_parts)  # fmt: skip
        self.out(_indent(self._release_table()))

    def services(self) -> None:
        api = self.cluster.api()
        model_store.provide(api, NAMESPACE, None)  # the claim the pvc:// samples name
        files = SAMPLE_FILES[:3] if self.quick else SAMPLE_FILES
        for name in files:
            body = on_kwok(yaml.safe_load((SAMPLES / name).read_text()))
            create_service(api, NAMESPACE, body)
            service = body["metadata"]["name"]
            wait_until(lambda s=service: self._bound(s), 120, f"the pods of {service} to be bound",
                       on_poll=self._check_parts)  # fmt: skip
            pods = owned(api, NAMESPACE, service)["Pod"]
            where = sorted({p.spec.node_name for p in pods})
            self.out(f"    {name}: {_resources(body)}; {len(pods)} pod(s) bound on"
                     f" {', '.join(where)}")  # fmt: skip

    def placements(self) -> None:
        snap = self.snapshot()
        rows = placement_table.gpu_rows(snap.inventories, snap.usages, snap.assignments,
                                        datetime.now(UTC), STALE_AFTER)  # fmt: skip
        self.out(_indent(placement_table.render(rows)))
        for problem in snap.problems:
            self.out(f"    unreadable: {problem}")

    def what_if(self) -> None:
        """What `infergrid what-if` prints on this cluster, read through the same listing."""
        nodes, pods = list_objects(self.cluster.api())
        policies = parse_policies(",".join(PLACEMENT_POLICIES))  # the extender's, as the CLI
        result = what_if(nodes, pods, policies, datetime.now(UTC), STALE_AFTER)
        self.out(_indent(what_if_report.table(result)))

    def engine(self) -> None:
        """The sample as a user applies it: unmodified, so it lands on the real node (KWOK's
        taint keeps it off the fake fleet), then reached through its Service."""
        kubectl(self.cluster.kubeconfig, "apply", "-n", SERVING, "-f", str(SERVED))
        self.out(f"    kubectl apply -n {SERVING} -f deploy/samples/{SERVED.name}")
        wait_until(self._serving, 600, f"a Ready engine pod of {SERVED_NAME}",
                   on_poll=self._check_parts)  # fmt: skip
        pod = self._serving()
        self.out(f"    pod {SERVING}/{pod.metadata.name} Ready on {pod.spec.node_name};"
                 f" engine: {self._engine_line(pod)}")  # fmt: skip
        self.engine_url = f"http://{pod.status.pod_ip}:8000"
        (gateway,) = self._release_pods("gateway")
        self.gateway_url = f"http://{gateway.status.pod_ip}:8080"  # this host routes pod IPs
        self.gateway_metrics = f"http://{gateway.status.pod_ip}:9090/metrics"
        wait_until(lambda: SERVED_NAME in self._models(), 60, "the gateway to route smollm2")
        self.out(f"    the chart's gateway, pod {RELEASE_NAMESPACE}/{gateway.metadata.name}, on"
                 f" {self.gateway_url}: one OpenAI endpoint; GET /v1/models ->"
                 f" {', '.join(self._models())}")  # fmt: skip
        self.out(f"    from anywhere: kubectl port-forward -n {RELEASE_NAMESPACE}"
                 f" svc/{RELEASE}-gateway 8080:80")  # fmt: skip
        prompts = PROMPTS[:1] if self.quick else PROMPTS
        for prompt in prompts:
            self.out(f"    user> {prompt}")
            text = "".join(self.stream_chat(prompt, 24 if self.quick else 64))
            self.out(f"    smollm2> {text.strip()}")

    def metrics(self) -> None:
        with urllib.request.urlopen(f"{self.engine_url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for line in summarize_metrics(text):
            self.out(f"    {line}")
        with urllib.request.urlopen(self.gateway_metrics, timeout=10) as resp:
            self.out(f"    {summarize_gateway(resp.read().decode())}")

    def report(self) -> None:
        """The report over the run so far, at the scrape interval; its page beside the logs.
        A scrape the last step has not reached yet waits for it: one interval more."""
        url = self.cluster.prometheus_url()
        if url is None:
            raise StepFailed("the cluster's Prometheus is not running")
        time.sleep(REPORT_STEP_S)
        report = report_from_prometheus(url, self.started_at, time.time(), REPORT_STEP_S)
        self.out(_indent(render_table(report)))
        page = self.state / "report.html"
        page.write_text(render_html(report))
        self.out(f"    the page, with its plots: {page}")

    # Helpers.

    def stream_chat(self, prompt: str, max_tokens: int) -> Iterator[str]:
        """The chat completion's text as the SSE chunks arrive, echoed as they come."""
        body = {"model": "smollm2", "stream": True, "max_tokens": max_tokens,
                "temperature": 0, "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
        req = urllib.request.Request(
            f"{self.gateway_url}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                delta = json.loads(line[6:])["choices"][0].get("delta", {})
                if piece := delta.get("content"):
                    yield piece

    def _models(self) -> list[str]:
        with urllib.request.urlopen(f"{self.gateway_url}/v1/models", timeout=10) as resp:
            return [m["id"] for m in json.loads(resp.read())["data"]]

    def snapshot(self) -> Snapshot:
        return read_snapshot(self.cluster.api())

    def how_to_reach(self) -> str:
        return "\n".join([
            f"    export KUBECONFIG={self.cluster.kubeconfig}",
            f"    kubectl get pods -n {RELEASE_NAMESPACE} -o wide   # the chart's components",
            f"    kubectl get inferenceservices,pods -n {NAMESPACE} -o wide",
            f"    kubectl get pods -n {SERVING} -o wide   # served from the real node",
            "    .venv/bin/infergrid placements",
            "    .venv/bin/infergrid what-if",
            f"    kubectl port-forward -n {RELEASE_NAMESPACE} svc/{RELEASE}-gateway 8080:80"
            "   # the gateway's Service, from anywhere",
            f"    curl {self.gateway_url}/v1/models   # or its pod's IP, from this host",
            f"    curl {self.gateway_url}/v1/chat/completions -H 'Content-Type: application/json'"
            " -d '{\"model\": \"smollm2\", \"messages\": [{\"role\": \"user\", \"content\": "
            "\"Hi\"}]}'",
            f"    curl {self.engine_url}/metrics   # the engine pod's own",
            f"    curl {self.gateway_metrics}",
            f"    kubectl logs -n {RELEASE_NAMESPACE} deploy/{RELEASE}-operator   # and the"
            " other components'",
            f"    cluster logs: {self.logs}",
            "    stop everything: make demo-down",
        ])  # fmt: skip

    def down(self) -> list[str]:
        return self.cluster.down()

    def _release_pods(self, component: str | None = None) -> list[client.V1Pod]:
        selector = f"{INSTANCE}={RELEASE}" + (f",{COMPONENT}={component}" if component else "")
        core = client.CoreV1Api(self.cluster.api())
        return core.list_namespaced_pod(RELEASE_NAMESPACE, label_selector=selector).items

    def _release_ready(self) -> bool:
        pods = self._release_pods()
        return bool(pods) and all(_ready(p) for p in pods)

    def _release_table(self) -> str:
        """The release's pods as `kubectl get pods -o wide` shows them, in short."""
        rows = [("POD", "READY", "NODE", "SERVICE ACCOUNT")]
        for pod in sorted(self._release_pods(), key=lambda p: p.metadata.name):
            statuses = container_statuses(pod)
            ready = f"{sum(s.ready for s in statuses)}/{len(statuses)}"
            rows.append((pod.metadata.name, ready, pod.spec.node_name or "-",
                         pod.spec.service_account_name or "-"))  # fmt: skip
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}"
                         for r in rows)  # fmt: skip

    def _release_state(self) -> str:
        try:
            return kubectl(self.cluster.kubeconfig, "get", "pods,events", "-n", RELEASE_NAMESPACE)
        except RuntimeError as err:
            return str(err)

    def _serving(self) -> client.V1Pod | None:
        """A Ready engine pod of the served sample, if there is one."""
        pods = owned(self.cluster.api(), SERVING, SERVED_NAME)["Pod"]
        return next((p for p in pods if _ready(p)), None)

    def _engine_line(self, pod: client.V1Pod) -> str:
        """The engine's own word on what it serves and where (its "ready:" log line)."""
        log = client.CoreV1Api(self.cluster.api()).read_namespaced_pod_log(
            pod.metadata.name, SERVING
        )
        lines = [_short(line) for line in log.splitlines() if '"ready: ' in line]
        return lines[-1] if lines else "(no ready line)"

    def _bound(self, service: str) -> bool:
        """Every pod the operator's Deployments ask for exists and is bound to a node."""
        children = owned(self.cluster.api(), NAMESPACE, service)
        wanted = sum(d.spec.replicas or 0 for d in children["Deployment"])
        pods = children["Pod"]
        return wanted > 0 and len(pods) == wanted and all(p.spec.node_name for p in pods)

    def _check_parts(self) -> None:
        """Fails the step, with the end of its log, when a container of the release is
        crash-looping or has failed: waiting any longer would not help."""
        core = client.CoreV1Api(self.cluster.api())
        for pod in self._release_pods():
            for status in container_statuses(pod):
                waiting = status.state.waiting if status.state else None
                if status.restart_count or (waiting and waiting.reason in _BROKEN):
                    log = core.read_namespaced_pod_log(
                        pod.metadata.name, RELEASE_NAMESPACE, container=status.name,
                        tail_lines=15, previous=bool(status.restart_count),
                    )  # fmt: skip
                    raise StepFailed(f"{pod.metadata.name} ({status.name}) restarted or"
                                     f" failed:\n{_indent(log)}")  # fmt: skip


_BROKEN = {"CrashLoopBackOff", "ErrImageNeverPull", "ImagePullBackOff", "CreateContainerError",
           "CreateContainerConfigError", "RunContainerError"}  # fmt: skip


def summarize_metrics(text: str) -> list[str]:
    """TTFT and TPOT medians (from the histograms) and the queue depth, in words."""
    from inference_operator.metrics_scrape import histogram_quantile

    buckets: dict[str, dict[float, float]] = {}
    gauges: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                series = buckets.setdefault(family.name, {})
                series[float(sample.labels["le"])] = sample.value
            elif family.type == "gauge":
                gauges[family.name] = sample.value
    lines = []
    for name, label in (("infergrid_engine_ttft_seconds", "time to first token"),
                        ("infergrid_engine_tpot_seconds", "time per output token")):  # fmt: skip
        series = tuple(sorted(buckets.get(name, {}).items()))
        p50 = histogram_quantile(0.5, series)
        count = int(series[-1][1]) if series else 0
        shown = f"{p50 * 1000:.0f} ms" if p50 is not None else "no data"
        lines.append(f"{label:<24} p50 {shown}  ({count} requests)")
    depth = gauges.get("infergrid_engine_queue_depth")
    lines.append(f"{'queue depth':<24} {depth:.0f}" if depth is not None else "queue depth: absent")
    return lines


def summarize_gateway(text: str) -> str:
    """The requests the gateway forwarded, by model and answer, in words."""
    counted: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "infergrid_gateway_requests":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    key = f"{sample.labels['model']} {sample.labels['code']}"
                    counted[key] = counted.get(key, 0) + sample.value
    shown = ", ".join(f"{k}: {v:.0f}" for k, v in sorted(counted.items())) or "none"
    return f"{'through the gateway':<24} {shown}"


def _ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _resources(body: dict) -> str:
    res = body["spec"].get("resources", {})
    if "migProfile" in res:
        return f"a MIG {res['migProfile']} instance per replica"
    if "gpus" in res:
        return f"{res['gpus']} whole GPUs per replica" + (
            f", {res['topology']}" if res.get("topology") else ""
        )
    return f"a {res.get('gpuMemoryMiB')} MiB, {res.get('gpuCores', 100)}% SM share per replica"


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())


def _short(line: str, width: int = 100) -> str:
    try:
        line = json.loads(line).get("message", line)
    except (ValueError, AttributeError):
        pass
    return line if len(line) <= width else line[: width - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", nargs="?", choices=["run", "down"], default="run")
    parser.add_argument("--keep", action="store_true", help="leave everything running")
    parser.add_argument("--quick", action="store_true", help="fewer services and tokens (CI)")
    args = parser.parse_args(argv)
    demo = Demo(keep=args.keep, quick=args.quick)
    if args.command == "down":
        stopped = demo.down()
        print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        return 0
    return demo.run()


if __name__ == "__main__":
    sys.exit(main())
