"""Discovery through the real NVML backend: prints this machine's GPU inventory as JSON.

    python -m bench.nvml_probe [--node NAME] [--usage] [--fake FLEET.yaml]

The same code path the device plugin publishes from, run by hand on a GPU machine, from the
repository root with whatever Python is there (no install of the project needed). It prints
first the versions it found (python, torch, triton, nvidia-ml-py, the driver and its CUDA),
"missing" for what is not installed. Without a GPU (or its driver, or nvidia-ml-py) it says
so and exits 1. --fake runs the same discovery on the fake backend fed from a fleet file's
node (--node, else the first), which is how CI checks the script without a GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import socket
import sys
import time
from datetime import UTC, datetime
from importlib import metadata

# (distribution, module): what the GPU scripts depend on, as pip names them.
PACKAGES = (("torch", "torch"), ("triton", "triton"), ("nvidia-ml-py", "pynvml"))


def package_versions() -> dict[str, str]:
    """Each package's installed version, without importing it; "missing" when absent."""
    found = {"python": platform.python_version()}
    for dist, module in PACKAGES:
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            present = importlib.util.find_spec(module) is not None
            found[dist] = "installed, version unknown" if present else "missing"
    if found["nvidia-ml-py"] == "missing" or "unknown" in found["nvidia-ml-py"]:
        try:  # the older, unofficial distribution of the same pynvml module
            found["pynvml"] = metadata.version("pynvml")
        except metadata.PackageNotFoundError:
            pass
    return found


def driver_versions() -> dict[str, str]:
    """The driver's version and the CUDA version it supports, from NVML where it starts."""
    try:
        import pynvml
    except ImportError:
        return {"driver": "missing (no pynvml)"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return {"driver": f"missing (nvmlInit: {err})"}
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        return {
            "driver": driver.decode() if isinstance(driver, bytes) else str(driver),
            "driver_cuda": f"{cuda // 1000}.{cuda % 1000 // 10}",
        }
    except pynvml.NVMLError as err:
        return {"driver": f"unknown ({err})"}
    finally:
        pynvml.nvmlShutdown()


def print_versions(*, driver: bool = True, file=None) -> None:
    found = package_versions() | (driver_versions() if driver else {})
    line = "versions: " + " ".join(f"{name}={value}" for name, value in found.items())
    print(line, file=file or sys.stdout, flush=True)


def open_backend(fake: str | None, node: str | None):
    """(backend, node name): the real NVML, or the fake one over a fleet file's node."""
    if fake is None:
        from infergrid.nvml.real import RealNvml

        return RealNvml(), node or socket.gethostname()
    from infergrid.fleet import load_fleet
    from infergrid.nvml.fake import FakeNvml

    nodes = load_fleet(fake).nodes
    chosen = next((n for n in nodes if n.name == node), None) if node else nodes[0]
    if chosen is None:
        raise SystemExit(f"--node {node}: not in {fake} ({', '.join(n.name for n in nodes)})")
    return FakeNvml(chosen), chosen.name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", default=None, help="node name (default: this host's)")
    parser.add_argument("--usage", action="store_true", help="also print one usage sample")
    parser.add_argument("--fake", metavar="FLEET", help="the fake backend over a fleet file")
    args = parser.parse_args()
    print_versions(driver=args.fake is None)
    if args.fake is None and importlib.util.find_spec("pynvml") is None:
        print("no NVML here: nvidia-ml-py (pynvml) is not installed", file=sys.stderr)
        return 1

    from device_plugin.discovery import discover, sample_usage
    from device_plugin.health import HealthTracker
    from infergrid.inventory import encode_inventory
    from infergrid.nvml.backend import NvmlError
    from infergrid.usage import encode_usage

    try:
        backend, node = open_backend(args.fake, args.node)
    except NvmlError as err:
        print(f"no NVML here: {err}", file=sys.stderr)
        return 1
    try:
        started = time.perf_counter()
        inventory = discover(backend, node, HealthTracker(60))
        took = time.perf_counter() - started
        print(json.dumps(json.loads(encode_inventory(inventory)), indent=2))
        if args.usage:
            usage = sample_usage(backend, node, datetime.now(UTC))
            print(json.dumps(json.loads(encode_usage(usage)), indent=2))
        print(f"discovered {len(inventory.gpus)} GPUs in {took * 1000:.1f} ms", file=sys.stderr)
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
