"""Device plugin latency over real unix-socket gRPC: Allocate and ListAndWatch.

One node with 64 fake GPUs and 10 share slots each (704 advertised devices
with the whole GPUs). Measured in one run, printed as a table (or --json):
  - Allocate of a share and of a whole GPU, each matched to its pod's assignment;
  - ListAndWatch: the first full device list after connecting, and the time
    from an XID event on a GPU to the stream carrying it unhealthy.

    python bench/device_plugin_latency.py [--gpus 64] [--slots 10] [--rounds 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from device_plugin.config import PluginConfig
from device_plugin.fake_kubelet import FakeKubelet
from device_plugin.kubelet import UNHEALTHY, api_pb2
from device_plugin.ledger import Ledger
from device_plugin.runtime import DevicePluginRuntime
from infergrid.assignment_annotation import AssignedGpu, ContainerAssignment, PodAssignment
from infergrid.constants import RESOURCE_GPU, RESOURCE_VGPU, SCHEDULER_NAME
from infergrid.fleet import parse_fleet
from infergrid.nvml.fake import FakeNvml
from infergrid.records import PodRecord


class Pods:
    def __init__(self):
        self.items: list[PodRecord] = []

    def pods(self) -> list[PodRecord]:
        return self.items


def percentiles(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {
        "p50_ms": statistics.median(ms),
        "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
        "n": len(ms),
    }


def node(gpus: int):
    doc = {
        "version": "v1",
        "nodes": [
            {
                "name": "bench",
                "gpus": {"model": "NVIDIA L4", "count": gpus, "memoryMiB": 23034, "smCount": 58,
                         "computeCapability": "8.9"},
                "topology": {"numaNodes": 2},
            }
        ],
    }  # fmt: skip
    return parse_fleet(doc, "bench").nodes[0]


def assigned(name: str, container: ContainerAssignment, at: datetime) -> PodRecord:
    return PodRecord(
        f"uid-{name}", "bench", name, "bench", SCHEDULER_NAME,
        PodAssignment("bench", at, (container,)),
    )  # fmt: skip


def allocate(stub, ids: list[str]) -> float:
    started = time.perf_counter()
    stub.Allocate(
        api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
        ),
        timeout=10,
    )
    return time.perf_counter() - started


def run(gpus: int, slots: int, rounds: int) -> dict:
    fleet_node = node(gpus)
    plugin_dir = Path(tempfile.mkdtemp(prefix="dp-bench-", dir="/tmp"))
    kubelet = FakeKubelet(plugin_dir)
    kubelet.start()
    nvml = FakeNvml(fleet_node)
    pods = Pods()
    config = PluginConfig(
        node_name="bench", plugin_dir=plugin_dir, vgpu_slots_per_gpu=slots, metrics_port=0,
        health_quiet_period_s=0.05,
    )  # fmt: skip
    runtime = DevicePluginRuntime(config, nvml, pods)
    runtime.start()
    try:
        kubelet.wait_registered({RESOURCE_GPU, RESOURCE_VGPU})
        uuids = [g.uuid for g in fleet_node.inventory.gpus]
        t0 = datetime(2026, 1, 1, tzinfo=UTC)
        shares = [
            assigned(f"s{i}", ContainerAssignment("c", (AssignedGpu(uuids[i % gpus], 100, 1),),
                                                  shared=True), t0 + timedelta(seconds=i))
            for i in range(rounds)
        ]  # fmt: skip
        pods.items = shares
        vgpu = kubelet.plugin(RESOURCE_VGPU)
        share_lat = [allocate(vgpu, [f"{uuids[i % gpus]}::vgpu-0"]) for i in range(rounds)]
        wholes = [
            assigned(f"w{i}", ContainerAssignment("c", (AssignedGpu(uuids[i], 23034, 100),)),
                     t0 + timedelta(seconds=i))
            for i in range(gpus)
        ]  # fmt: skip
        runtime.manager.ledger = Ledger()
        pods.items = wholes
        gpu = kubelet.plugin(RESOURCE_GPU)
        whole_lat = [allocate(gpu, [uuids[i]]) for i in range(gpus)]

        first_list = []
        for _ in range(rounds // 4):
            started = time.perf_counter()
            stream = vgpu.ListAndWatch(api_pb2.Empty(), timeout=30)
            devices = next(stream).devices
            first_list.append(time.perf_counter() - started)
            stream.cancel()
        stream = gpu.ListAndWatch(api_pb2.Empty(), timeout=120)
        next(stream)
        flips = []
        for i in range(min(rounds, 100)):
            index = i % gpus
            started = time.perf_counter()
            nvml.inject_xid(index, 32)  # transient: it recovers after the quiet period
            for message in stream:
                if any(d.ID == uuids[index] and d.health == UNHEALTHY for d in message.devices):
                    flips.append(time.perf_counter() - started)
                    break
            time.sleep(0.1)  # let it recover before the next flip
        stream.cancel()
    finally:
        runtime.stop()
        kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
    return {
        "gpus": gpus,
        "slots_per_gpu": slots,
        "advertised_share_slots": len(devices),
        "allocate_share": percentiles(share_lat),
        "allocate_whole": percentiles(whole_lat),
        "list_and_watch_first_list": percentiles(first_list),
        "list_and_watch_health_change": percentiles(flips),
    }


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.gpus, args.slots, args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.gpus} GPUs x {args.slots} slots ({result['advertised_share_slots']} share slots)")
    print(f"{'operation':<32}{'p50 ms':>10}{'p99 ms':>10}{'n':>6}")
    for key in ("allocate_share", "allocate_whole", "list_and_watch_first_list",
                "list_and_watch_health_change"):  # fmt: skip
        row = result[key]
        print(f"{key:<32}{row['p50_ms']:>10.2f}{row['p99_ms']:>10.2f}{row['n']:>6}")


if __name__ == "__main__":
    main()
