"""An engine's start on a simulated GPU: the runner's real budget code, with no model loaded.

`start_engine` does what ModelRunner.__init__ does on a GPU, in its order, against one client
of a simulated GPU: the memory meter opened (its NVML baseline) before the CUDA context, the
context, the weights, the activation profile (which leaves cuBLAS and Triton memory outside
torch and gives its activations back), then the runner's own `_kv_cache_bytes`, and the KV
cache allocated. Tests call it in-process; the GPU scripts' dry run runs it as one process
per engine, attached to a file-backed GPU:

    python -m harness.simulated_engine --gpu STATE.json --share-mib 4096 [--pid N] [--env K=V]

which prints one JSON line once started ({"ready": ...} or {"refused": ...}, exiting 2 like
the engine), then answers lines on stdin: `step` (a decode step's activations allocated and
freed), `allocate MIB`, and `quit` (the process's memory goes back to the device).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from batching_engine.memory_budget import resolve_memory_budget
from batching_engine.model.activation_profile import ActivationPeaks
from batching_engine.model_runner import ModelRunner
from harness.simulated_gpu import MIB, SimulatedClient, SimulatedGpu
from infergrid.errors import ContractError


@dataclass(frozen=True, slots=True)
class EngineShape:
    """What a model costs on the device: weights, the profile's activation peaks, and the
    cuBLAS workspaces and Triton modules the profile leaves loaded (outside torch)."""

    weight_bytes: int
    peaks: ActivationPeaks
    kernels_bytes: int = 64 * MIB


# SmolLM2-135M in bf16 with the engine's defaults, roughly as a GPU measures it.
SMOLLM2 = EngineShape(270 * MIB, ActivationPeaks(step=400 * MIB, decode_forward=60 * MIB))


@dataclass(frozen=True, slots=True)
class EngineStart:
    """What one engine planned and holds once started, in bytes."""

    kv_bytes: int
    held_bytes: int
    outside_torch: int
    method: str


def start_engine(client: SimulatedClient, budget_bytes: int, shape: EngineShape) -> EngineStart:
    """Raises ContractError where the real runner refuses, OutOfMemoryError where the
    simulated device does."""
    runner = object.__new__(ModelRunner)
    runner.device = torch.device("cuda:0")
    runner.cuda_memory, runner.nvml_memory = client, client.nvml
    runner.memory_meter = runner._open_memory_meter()
    client.create_context()
    runner.model = _weights(shape.weight_bytes)
    client.allocate(shape.weight_bytes)
    runner._activation_peaks = lambda: _profile(client, shape)
    kv = runner._kv_cache_bytes(None, budget_bytes, graphs=True)
    client.allocate(kv)
    _, own = runner.memory_meter.measure(runner.device)
    return EngineStart(kv, client.held(), own.outside_torch, own.method)


def step(client: SimulatedClient, shape: EngineShape) -> None:
    """One decode step's activations, allocated and given back to the device."""
    client.allocate(shape.peaks.decode_forward)
    client.free(shape.peaks.decode_forward)


def _weights(nbytes: int) -> torch.nn.Module:
    """A module whose buffers count `nbytes` (on the meta device: no memory behind them)."""
    module = torch.nn.Module()
    module.register_buffer("weights", torch.empty(nbytes, dtype=torch.uint8, device="meta"))
    return module


def _profile(client: SimulatedClient, shape: EngineShape) -> ActivationPeaks:
    """The dummy steps: kernels loaded for good, the peak allocated and emptied from the cache."""
    client.allocate(shape.kernels_bytes, outside_torch=True)
    client.allocate(shape.peaks.step)
    client.free(shape.peaks.step)
    return shape.peaks


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    environ = dict(item.split("=", 1) for item in args.env)
    client = SimulatedGpu.attach(args.gpu).client(args.pid, environ)
    share = {"INFERGRID_GPU_MEMORY_MIB": str(args.share_mib)}
    budget = resolve_memory_budget(device="cuda", environ=share)
    try:
        started = start_engine(client, budget.total_bytes, SMOLLM2)
    except (ContractError, torch.cuda.OutOfMemoryError) as err:
        client.exit()
        _say({"refused": str(err)})
        return 2
    _say({"ready": asdict(started)})
    for line in sys.stdin:
        if _answer(client, line.split()) is None:
            break
    client.exit()
    return 0


def _answer(client: SimulatedClient, words: list[str]) -> bool | None:
    """One command's reply, printed; None for quit."""
    if not words or words[0] == "quit":
        return None
    try:
        if words[0] == "step":
            step(client, SMOLLM2)
        else:
            client.allocate(int(words[1]) * MIB)
        _say({"ok": True, "held_bytes": client.held()})
    except torch.cuda.OutOfMemoryError as err:
        _say({"ok": False, "error": f"OutOfMemoryError: {err}"})
    return True


def _say(doc: dict) -> None:
    print(json.dumps(doc), flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=Path, required=True, help="the simulated GPU's state file")
    parser.add_argument("--pid", type=int, default=os.getpid(), help="default: this process's")
    parser.add_argument("--share-mib", type=int, required=True, help="INFERGRID_GPU_MEMORY_MIB")
    parser.add_argument("--env", action="append", default=[], help="the client's K=V")
    return parser


if __name__ == "__main__":
    sys.exit(main())
