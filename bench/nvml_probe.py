"""Discovery through the real NVML backend: prints this machine's GPU inventory as JSON.

    python bench/nvml_probe.py [--node NAME] [--usage]

The same code path the device plugin publishes from, run by hand on a GPU
machine. Without a GPU (or its driver) it says so and exits 1.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from datetime import UTC, datetime

from device_plugin.discovery import discover, sample_usage
from device_plugin.health import HealthTracker
from device_plugin.nvml.backend import NvmlError
from device_plugin.nvml.real import RealNvml
from infergrid.inventory import encode_inventory
from infergrid.usage import encode_usage


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", default=socket.gethostname())
    parser.add_argument("--usage", action="store_true", help="also print one usage sample")
    args = parser.parse_args()
    try:
        backend = RealNvml()
    except NvmlError as err:
        print(f"no NVML here: {err}", file=sys.stderr)
        return 1
    try:
        started = time.perf_counter()
        inventory = discover(backend, args.node, HealthTracker(60))
        took = time.perf_counter() - started
        print(json.dumps(json.loads(encode_inventory(inventory)), indent=2))
        if args.usage:
            usage = sample_usage(backend, args.node, datetime.now(UTC))
            print(json.dumps(json.loads(encode_usage(usage)), indent=2))
        print(f"discovered {len(inventory.gpus)} GPUs in {took * 1000:.1f} ms", file=sys.stderr)
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
