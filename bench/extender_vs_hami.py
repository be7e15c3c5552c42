"""HAMi's scheduler beside InferGrid's extender: one KWOK fleet, one stream of GPU shares, one run.

HAMi (github.com/Project-HAMi/HAMi) is built once from a checkout (``--hami-src``, see
``bench/hami_build.py``) and run as its chart deploys it: its extender process (filter and bind
verbs, the chart's device config for NVIDIA) behind a kube-scheduler of its own whose config is
the chart's (``hami_scheduler_config``). Each KWOK node carries both what InferGrid's device
plugin publishes and what HAMi's publishes (``hami.io/node-nvidia-register``, written from the
same fleet entry by ``hami_register_annotation``), so both see the same GPUs.

The same pods go to each: GPU shares of a seeded mix of sizes, asked for in each system's own
resource names (``share_limits``). First a stream (each pod created once the one before is
bound), then a burst (``--pods`` gated pods released at once; pods/s to the last one bound).
A timing relay sits between each kube-scheduler and its extender and times every verb call
from the request's first byte forwarded to the answer's last byte back, so both are measured
the same way, as kube-scheduler waits for them. A bind that answers an error (HAMi's node lock
held by another pod, say) counts as a failed bind; kube-scheduler retries that pod later.

HAMi's node lock is released by its device plugin when the kubelet calls Allocate. KWOK nodes
have no kubelet, so a stand-in (``LockReleaser``) does what that plugin does, at once after
the bind: marks the pod's ``hami.io/bind-phase`` success and deletes the node's lock. A real
kubelet's Allocate comes later than that, so this is HAMi's best case.

    .venv/bin/python -m bench.extender_vs_hami --hami-src DIR [--hami-commit COMMIT]
        [--nodes 100] [--stream 30] [--pods 100] [--hami-qps 0] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import yaml

from infergrid import constants
from infergrid.inventory import GpuInventory

HAMI_SCHEDULER = "hami-scheduler"
HAMI_REGISTER = "hami.io/node-nvidia-register"
HAMI_BIND_PHASE = "hami.io/bind-phase"
HAMI_NODE_LOCK = "hami.io/mutex.lock"
HAMI_GPU, HAMI_MEM, HAMI_CORES = "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores"
HAMI_MODE = "hami-core"  # what HAMi's device plugin registers outside MIG mode
BENCH_LABEL = {"infergrid.io/bench": "extender-vs-hami"}
GPUS = {"model": "NVIDIA L4", "count": 8, "memoryMiB": 23034, "smCount": 58,
        "computeCapability": "8.9"}  # fmt: skip
SHARES = ((4096, None), (8192, 30), (16384, None))  # (MiB, % of SMs or None)
SYSTEMS = ("InferGrid", "HAMi")


def hami_register_annotation(inventory: GpuInventory) -> str:
    """``hami.io/node-nvidia-register`` as HAMi's device plugin writes it for these GPUs (its
    ``getAPIDevices``, device memory and core scaling 1): one entry per healthy-or-not GPU, as
    many shares per GPU as InferGrid's plugin offers, so both bound a GPU's sharers alike."""
    devices = []
    for gpu in inventory.gpus:
        model = gpu.model if gpu.model.startswith("NVIDIA") else f"NVIDIA-{gpu.model}"
        devices.append({"id": gpu.uuid, "index": gpu.index, "count": inventory.share_slots,
                        "devmem": gpu.memory_mib, "devcore": 100, "type": model,
                        "numa": gpu.numa_node, "mode": HAMI_MODE,
                        "health": gpu.healthy})  # fmt: skip
    return json.dumps(devices, separators=(",", ":"))


def hami_device_config(split_count: int) -> str:
    """The NVIDIA section of HAMi's chart's device config (its values' defaults), the one
    vendor this fleet has; ``split_count`` shares per GPU, as the register annotation says."""
    nvidia = {
        "resourceCountName": HAMI_GPU, "resourceMemoryName": HAMI_MEM,
        "resourceMemoryPercentageName": "nvidia.com/gpumem-percentage",
        "resourceCoreName": HAMI_CORES, "resourcePriorityName": "nvidia.com/priority",
        "overwriteEnv": False, "defaultMemory": 0, "defaultCores": 0, "defaultGPUNum": 1,
        "memoryFactor": 1, "deviceSplitCount": split_count, "deviceMemoryScaling": 1,
        "deviceCoreScaling": 1, "gpuCorePolicy": "default",
    }  # fmt: skip
    return yaml.safe_dump({"nvidia": nvidia})


def hami_scheduler_config(kubeconfig: Path, extender_url: str) -> str:
    """HAMi's chart's KubeSchedulerConfiguration (Kubernetes >= 1.26, no admission webhook):
    the default profile under HAMi's scheduler name, HAMi's extender for filter and bind."""
    managed = [HAMI_GPU, HAMI_MEM, "nvidia.com/gpumem-percentage", HAMI_CORES,
               "nvidia.com/priority"]  # fmt: skip
    return yaml.safe_dump({
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": HAMI_SCHEDULER}],
        "extenders": [{
            "urlPrefix": extender_url, "enableHTTPS": False, "filterVerb": "filter",
            "bindVerb": "bind", "nodeCacheCapable": True, "weight": 1, "httpTimeout": "30s",
            "managedResources": [{"name": n, "ignoredByScheduler": True} for n in managed],
        }],
    })  # fmt: skip


def share_stream(count: int, seed: int) -> list[tuple[int, int | None]]:
    """The pods both systems get, in order: (MiB, % of SMs or None) per pod."""
    rnd = random.Random(seed)
    return [rnd.choice(SHARES) for _ in range(count)]


def share_limits(system: str, mib: int, cores: int | None) -> dict[str, str]:
    """One share in the resource names of ``system``."""
    if system == "InferGrid":
        limits = {constants.RESOURCE_VGPU: "1", constants.RESOURCE_GPU_MEMORY: str(mib)}
        return limits | ({constants.RESOURCE_GPU_CORES: str(cores)} if cores else {})
    if system == "HAMi":
        return {HAMI_GPU: "1", HAMI_MEM: str(mib)} | ({HAMI_CORES: str(cores)} if cores else {})
    raise ValueError(f"system: {system!r} is not one of {SYSTEMS}")


def share_pod(system: str, name: str, mib: int, cores: int | None, gated: bool) -> dict:
    """A share pod for ``system``'s scheduler, kept to the bench's KWOK nodes."""
    from e2e.cluster.fake_nodes import KWOK_TOLERATION

    scheduler = constants.SCHEDULER_NAME if system == "InferGrid" else HAMI_SCHEDULER
    limits = share_limits(system, mib, cores)
    spec = {"schedulerName": scheduler, "tolerations": [KWOK_TOLERATION],
            "nodeSelector": dict(BENCH_LABEL),
            "containers": [{"name": "engine", "image": "engine",
                            "resources": {"limits": limits}}]}  # fmt: skip
    if gated:
        spec["schedulingGates"] = [{"name": "bench"}]
    return {"metadata": {"name": name, "labels": dict(BENCH_LABEL)}, "spec": spec}


def hami_gpus_seen(metrics: str) -> set[str]:
    """The GPU uuids HAMi's scheduler offers, read from its /metrics: once every bench GPU is
    there, its register loop has read every node's annotation."""
    seen = set()
    for line in metrics.splitlines():
        if line.startswith("hami_gpu_memory_limit_bytes{"):
            labels = line[line.index("{") + 1 : line.rindex("}")]
            for pair in labels.split(","):
                key, _, value = pair.partition("=")
                if key == "device_uuid":
                    seen.add(value.strip('"'))
    return seen


def percentiles(samples: list[float]) -> dict[str, float | int]:
    """p50 and p99 in ms, and how many samples; zeros for none."""
    if not samples:
        return {"n": 0, "p50_ms": 0.0, "p99_ms": 0.0}
    ms = sorted(s * 1000 for s in samples)
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 2),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2)}  # fmt: skip


def table(rows: dict[str, dict]) -> str:
    """The markdown table: each figure for InferGrid and HAMi, and HAMi over InferGrid."""
    figures = [("stream filter p50 (ms)", "stream", "filter", "p50_ms"),
               ("stream filter p99 (ms)", "stream", "filter", "p99_ms"),
               ("stream bind p50 (ms)", "stream", "bind", "p50_ms"),
               ("stream bind p99 (ms)", "stream", "bind", "p99_ms"),
               ("burst filter p50 (ms)", "burst", "filter", "p50_ms"),
               ("burst filter p99 (ms)", "burst", "filter", "p99_ms"),
               ("burst bind p50 (ms)", "burst", "bind", "p50_ms"),
               ("burst bind p99 (ms)", "burst", "bind", "p99_ms"),
               ("stream extender ms per pod, all verbs", "stream", "extender_ms_per_pod", None),
               ("burst extender ms per pod, all verbs", "burst", "extender_ms_per_pod", None),
               ("burst failed binds", "burst", "failed_binds", None),
               ("burst pods/s", "burst", "pods_per_s", None)]  # fmt: skip
    lines = ["| figure | InferGrid | HAMi | HAMi / InferGrid |", "|---|---|---|---|"]
    for label, phase, key, sub in figures:
        ig, hami = (_figure(rows[s][phase], key, sub) for s in SYSTEMS)
        ratio = f"{hami / ig:.2f}" if ig else "-"
        lines.append(f"| {label} | {ig:g} | {hami:g} | {ratio} |")
    return "\n".join(lines)


def _figure(phase: dict, key: str, sub: str | None) -> float:
    return phase[key][sub] if sub else phase[key]


class TimingRelay:
    """An HTTP relay between a kube-scheduler and its extender that times each verb call:
    from forwarding the request to the answer's last byte, per path; a bind answered with an
    error counts as failed. Runs its own event loop on a thread."""

    def __init__(self, listen_port: int, upstream_port: int):
        self.listen_port, self.upstream = listen_port, f"http://127.0.0.1:{upstream_port}"
        self.samples: list[tuple[str, float, bool]] = []  # (path, seconds, ok)
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)
        self._ready = threading.Event()

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"the timing relay on port {self.listen_port} did not start")

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def take(self) -> list[tuple[str, float, bool]]:
        """The samples so far, and a fresh start."""
        taken, self.samples = self.samples, []
        return taken

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        import aiohttp
        from aiohttp import web

        self._stop = asyncio.Event()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

            async def relay(request: web.Request) -> web.Response:
                body = await request.read()
                started = time.perf_counter()
                async with session.post(
                    self.upstream + request.raw_path,
                    data=body,
                    headers={"Content-Type": "application/json"},
                ) as resp:
                    raw = await resp.read()
                took = time.perf_counter() - started
                ok = resp.status == 200
                if ok and request.path.endswith("bind"):
                    ok = not json.loads(raw or b"{}").get("Error")
                self.samples.append((request.path, took, ok))
                return web.Response(body=raw, status=resp.status, content_type="application/json")

            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_post("/{verb:.*}", relay)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.listen_port).start()
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()


class LockReleaser:
    """What HAMi's device plugin does in Allocate once a pod is bound: its bind phase marked
    success and its node's lock deleted (only if that pod holds it). KWOK nodes have no
    kubelet to call Allocate, so this watches the bench's HAMi pods and does it at once."""

    def __init__(self, api):
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.released = 0
        self._done: set[str] = set()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="hami-allocate")
        self._thread = threading.Thread(target=self._watch, name="lock-releaser", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True)

    def _watch(self) -> None:
        from kubernetes import watch

        selector = ",".join(f"{k}={v}" for k, v in BENCH_LABEL.items())
        while not self._stop.is_set():
            stream = watch.Watch().stream(self.core.list_pod_for_all_namespaces,
                                          label_selector=selector, timeout_seconds=5)  # fmt: skip
            for event in stream:
                pod = event["object"]
                phase = (pod.metadata.annotations or {}).get(HAMI_BIND_PHASE)
                if (
                    pod.spec.node_name
                    and phase == "allocating"
                    and pod.metadata.uid not in self._done
                ):
                    self._done.add(pod.metadata.uid)
                    self._pool.submit(self._allocated, pod)

    def _allocated(self, pod) -> None:
        from kubernetes.client.rest import ApiException

        meta = pod.metadata
        patch = {"metadata": {"annotations": {HAMI_BIND_PHASE: "success"}}}
        self.core.patch_namespaced_pod(meta.name, meta.namespace, patch)
        for _ in range(5):  # as the plugin's ReleaseNodeLock, a conflict is read again
            node = self.core.read_node(pod.spec.node_name)
            lock = (node.metadata.annotations or {}).get(HAMI_NODE_LOCK, "")
            if not lock.endswith(f",{meta.namespace},{meta.name}"):
                return
            unlock = {"metadata": {"annotations": {HAMI_NODE_LOCK: None},
                                   "resourceVersion": node.metadata.resource_version}}  # fmt: skip
            try:
                self.core.patch_node(node.metadata.name, unlock)
                self.released += 1
                return
            except ApiException as err:
                if err.status != 409:
                    raise


def _node_of(core, name: str, namespace: str) -> str | None:
    return core.read_namespaced_pod(name, namespace).spec.node_name


def run_system(api, system: str, relay: TimingRelay, stream: list, burst: list) -> dict:
    """The stream, then the burst, through ``system``'s scheduler; the relay's timings."""
    from kubernetes import client

    from e2e.cluster.processes import wait_until

    core = client.CoreV1Api(api)
    prefix = system.lower()
    result = {}
    for phase, pods, gated in (("stream", stream, False), ("burst", burst, True)):
        namespace = f"{prefix}-{phase}"
        core.create_namespace({"metadata": {"name": namespace}})
        wait_until(lambda n=namespace: core.read_namespaced_service_account("default", n), 60,
                   "the SA")  # fmt: skip
        relay.take()
        names = [f"p-{i:04d}" for i in range(len(pods))]
        for name, (mib, cores) in zip(names, pods, strict=True):
            core.create_namespaced_pod(namespace, share_pod(system, name, mib, cores, gated))
            if not gated:
                wait_until(lambda n=name, ns=namespace: _node_of(core, n, ns), 120,
                           f"{system} to bind {namespace}/{name}")  # fmt: skip
        started = time.perf_counter()
        if gated:
            for name in names:
                core.patch_namespaced_pod(name, namespace, {"spec": {"schedulingGates": None}})

        def all_bound(ns: str = namespace) -> bool:
            return all(p.spec.node_name for p in core.list_namespaced_pod(ns).items)

        wait_until(all_bound, 900, f"{system}'s {phase} bound")
        took = time.perf_counter() - started
        samples = relay.take()
        result[phase] = {
            "pods": len(pods),
            "filter": percentiles([s for p, s, _ in samples if p.endswith("filter")]),
            "bind": percentiles([s for p, s, ok in samples if p.endswith("bind") and ok]),
            "prioritize": percentiles([s for p, s, _ in samples if p.endswith("prioritize")]),
            "failed_binds": sum(1 for p, _, ok in samples if p.endswith("bind") and not ok),
            "extender_ms_per_pod": round(sum(s for _, s, _ in samples) * 1000 / len(pods), 2),
            "pods_per_s": round(len(pods) / took, 1) if gated else 0.0,
        }
        print(f"{system} {phase}: {json.dumps(result[phase])}", file=sys.stderr, flush=True)
    return result


@contextmanager
def infergrid_side(cluster, work: Path) -> Iterator[TimingRelay]:
    """InferGrid's extender (defaults, tentative reservations) behind a relay on the port the
    cluster's infergrid-scheduler calls."""
    from urllib.parse import urlparse

    from e2e.cluster.local_cluster import _free_ports
    from e2e.extender_support import BENCH_LEASE, ExtenderProcess

    port = _free_ports(1)[0]
    process = ExtenderProcess(f"http://127.0.0.1:{port}/", cluster.kubeconfig,
                              work / "infergrid-extender.log", BENCH_LEASE)  # fmt: skip
    process.args = ["--stale-after", "3600"]  # heartbeats are published once
    relay = TimingRelay(urlparse(cluster.extender_url()).port, port)
    process.start()
    relay.start()
    try:
        yield relay
    finally:
        relay.stop()
        process.stop()


@contextmanager
def hami_side(
    cluster, work: Path, binary: Path, qps: int, split: int, gpus: set[str]
) -> Iterator[tuple[TimingRelay, float]]:
    """HAMi's extender (the chart's flags), a relay in front of it, and HAMi's kube-scheduler
    (the chart's config) calling the relay; and the device plugin's lock release. Yields the
    relay, and the seconds HAMi took from its start to offer every one of ``gpus``."""
    import urllib.request

    from e2e.cluster import components
    from e2e.cluster.local_cluster import _free_ports, _healthz
    from e2e.cluster.processes import wait_until

    hami_port, metrics_port, relay_port, scheduler_port = _free_ports(4)
    (work / "device-config.yaml").write_text(hami_device_config(split))
    argv = [str(binary), f"--http_bind=127.0.0.1:{hami_port}",
            f"--scheduler-name={HAMI_SCHEDULER}",
            f"--metrics-bind-address=127.0.0.1:{metrics_port}",
            "--node-scheduler-policy=binpack", "--gpu-scheduler-policy=spread",
            f"--device-config-file={work / 'device-config.yaml'}",
            "--leader-elect=false"]  # fmt: skip
    if qps:
        argv += [f"--kube-qps={qps}", f"--kube-burst={2 * qps}"]
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    started = time.monotonic()
    cluster.processes.start("hami-extender", argv, env=env)

    def offers_every_gpu() -> bool:
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return gpus <= hami_gpus_seen(resp.read().decode())

    # Its first register pass patches a handshake per node and vendor, under its client's QPS.
    wait_until(offers_every_gpu, 120 + 4 * len(gpus) / 8, "HAMi to offer every bench GPU",
               lambda: cluster.processes.check_alive("hami-extender"))  # fmt: skip
    registered_s = time.monotonic() - started
    relay = TimingRelay(relay_port, hami_port)
    relay.start()
    config = work / "hami-scheduler.yaml"
    config.write_text(hami_scheduler_config(cluster.kubeconfig, f"http://127.0.0.1:{relay_port}"))
    argv = components.scheduler_command(cluster._load_layout(), config, scheduler_port)
    cluster.processes.start("hami-kube-scheduler", argv)
    wait_until(_healthz(scheduler_port), 60, "HAMi's kube-scheduler",
               lambda: cluster.processes.check_alive("hami-kube-scheduler"))  # fmt: skip
    releaser = LockReleaser(cluster.api())
    releaser.start()
    try:
        yield relay, registered_s
    finally:
        releaser.stop()
        relay.stop()
        cluster.processes.stop("hami-kube-scheduler")
        cluster.processes.stop("hami-extender")


def run(args: argparse.Namespace) -> dict:
    from kubernetes import client

    from bench.hami_build import ensure_built
    from e2e.cluster.local_cluster import LocalCluster
    from e2e.extender_support import idle_nodes
    from infergrid.fleet import parse_fleet

    binary, commit = ensure_built(args.hami_src, args.hami_commit)
    work = Path(tempfile.mkdtemp(prefix="infergrid-vs-hami-"))
    (work / "fleet.yaml").write_text(yaml.safe_dump({"version": "v1", "nodes": [
        {"name": "base", "count": 1, "gpus": GPUS}]}))  # fmt: skip
    entries = [{"name": "gpu", "count": args.nodes, "gpus": GPUS}]
    fleet = parse_fleet({"version": "v1", "nodes": entries}, "bench")
    split = fleet.nodes[0].inventory.share_slots
    gpus = {g.uuid for node in fleet.nodes for g in node.inventory.gpus}
    stream = share_stream(args.stream, args.seed)
    burst = share_stream(args.pods, args.seed + 1)
    cluster = LocalCluster(work / "state")
    cluster.up(work / "fleet.yaml")
    try:
        api = cluster.api()
        with idle_nodes(api, entries, labels=BENCH_LABEL):
            core = client.CoreV1Api(api)
            for node in fleet.nodes:
                register = hami_register_annotation(node.inventory)
                core.patch_node(node.name, {"metadata": {"annotations": {HAMI_REGISTER: register}}})
            rows = {}
            with infergrid_side(cluster, work) as relay:
                rows["InferGrid"] = run_system(api, "InferGrid", relay, stream, burst)
            with hami_side(cluster, work, binary, args.hami_qps, split, gpus) as (relay, took):
                print(f"HAMi offered all {len(gpus)} GPUs {took:.1f} s after its start",
                      file=sys.stderr, flush=True)  # fmt: skip
                rows["HAMi"] = run_system(api, "HAMi", relay, stream, burst)
    finally:
        cluster.down()
    print(f"bench logs: {work / 'state' / 'logs'}", file=sys.stderr)
    return {"hami_commit": commit, "nodes": args.nodes, "gpus_per_node": GPUS["count"],
            "stream_pods": args.stream, "burst_pods": args.pods, "hami_qps": args.hami_qps,
            "hami_registered_s": round(took, 1), "rows": rows}  # fmt: skip


def main() -> None:
    from bench.hami_build import PINNED_COMMIT, HamiSourceError

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hami-src", type=Path, required=True, help="a git checkout of HAMi")
    parser.add_argument(
        "--hami-commit", default=PINNED_COMMIT, help="the commit the checkout must be at"
    )
    parser.add_argument("--nodes", type=int, default=100, help="KWOK nodes of 8 L4 GPUs")
    parser.add_argument("--stream", type=int, default=30, help="pods created one by one")
    parser.add_argument("--pods", type=int, default=100, help="pods of the burst")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--hami-qps", type=int, default=0,
                        help="HAMi's --kube-qps (burst twice it); 0 keeps its default, as the "
                             "chart does")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    for field in ("nodes", "stream", "pods"):
        if getattr(args, field) < 1:
            parser.error(f"--{field} must be at least 1")
    try:
        result = run(args)
    except HamiSourceError as err:
        parser.error(str(err))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"HAMi {result['hami_commit'][:12]} beside InferGrid: {args.nodes} KWOK nodes x"
        f" {GPUS['count']} L4, {args.stream} pods streamed, {args.pods} in the burst\n"
    )
    print(table(result["rows"]))
    for phase in ("stream", "burst"):
        prio = result["rows"]["InferGrid"][phase]["prioritize"]
        print(
            f"\nInferGrid's {phase} prioritize p50 {prio['p50_ms']} ms, p99 {prio['p99_ms']} ms"
            " (HAMi has no prioritize verb: its filter scores and returns one node)",
            end="",
        )
    print(f"\nHAMi offered every GPU {result['hami_registered_s']} s after its start")


if __name__ == "__main__":
    main()
