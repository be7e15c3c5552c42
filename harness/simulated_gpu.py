"""One simulated GPU shared by client processes, answering as CUDA and NVML do: the fake at the
hardware edge that the engine's memory budget is tested through.

Each client (one process, known by its pid) offers the two calls of torch.cuda the runner
reads (`mem_get_info`, `memory_reserved`), allocates and frees torch-reserved bytes and bytes
outside torch (a CUDA context charges `CONTEXT_BYTES`), and sees NVML through `client.nvml`
(the runner's `ProcessNvml`). What they see follows the real driver:

- without MPS, `mem_get_info` is device-wide: every client's memory is in it;
- a client whose environment sets CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, while the GPU's MPS
  server runs, sees its limit as the total and the limit less its own use as free, and an
  allocation past the limit fails in that client only. Without a running server the variable
  does nothing, as with real CUDA;
- an allocation past the device's free memory fails (torch.cuda.OutOfMemoryError);
- NVML reports the card's size, the device's used memory (both with the driver's own reserve,
  which CUDA's total leaves out) and the used memory of each process holding any, by pid:
  optionally by host pids that do not match the client's (a container's view), optionally
  NOT_AVAILABLE;
- a MIG instance: CUDA sees the instance, NVML's card size is the parent's.

The state lives in memory, or in a JSON file (locked with fcntl for each change) that several
processes attach to, which is how the GPU scripts' dry run shares one simulated GPU between
two engine processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from batching_engine.own_memory import MPS_LIMIT_ENV, NvmlReading, mps_pinned_limit

MIB = 1 << 20
CONTEXT_BYTES = 300 * MIB
DRIVER_RESERVED_BYTES = 512 * MIB
HOST_PID_OFFSET = 100_000


class SimulatedGpu:
    """The device's state and the views every client shares; `client` makes one."""

    def __init__(self, state: dict[str, Any] | None = None, path: Path | None = None) -> None:
        self._state, self.path = state, path

    @classmethod
    def create(
        cls,
        total_bytes: int,
        *,
        path: Path | None = None,
        mig_card_bytes: int | None = None,
        host_pids: bool = False,
        per_process_memory: bool = True,
    ) -> SimulatedGpu:
        """A GPU of `total_bytes` as CUDA sees it (`mig_card_bytes`: a MIG instance of a
        card that size), in memory or in the file `path`."""
        state = {
            "total": total_bytes,
            "card": mig_card_bytes or total_bytes + DRIVER_RESERVED_BYTES,
            "mig": mig_card_bytes is not None,
            "mps_server": False,
            "host_pids": host_pids,
            "per_process_memory": per_process_memory,
            "clients": {},
        }
        if path is None:
            return cls(state=state)
        Path(path).write_text(json.dumps(state))
        return cls(path=Path(path))

    @classmethod
    def attach(cls, path: Path) -> SimulatedGpu:
        """The GPU another process created in `path`."""
        return cls(path=Path(path))

    def client(self, pid: int, environ: Mapping[str, str] | None = None) -> SimulatedClient:
        """Process `pid` on this GPU, which is its CUDA device 0."""
        return SimulatedClient(self, pid, dict(environ or {}))

    def set_mps_server(self, running: bool) -> None:
        with self.transaction() as state:
            state["mps_server"] = running

    def used(self) -> int:
        """Bytes every client holds (what CUDA's device-wide view counts as used)."""
        with self.transaction() as state:
            return _device_used(state)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[dict[str, Any]]:
        """The state, written back afterwards; a file's under an exclusive lock."""
        if self.path is None:
            yield self._state
            return
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = json.loads(self.path.read_text())
            yield state
            staged = self.path.with_suffix(".tmp")
            staged.write_text(json.dumps(state))
            staged.replace(self.path)


class SimulatedClient:
    """One process on the simulated GPU: torch.cuda's memory calls, its allocations, NVML."""

    def __init__(self, gpu: SimulatedGpu, pid: int, environ: dict[str, str]) -> None:
        self.gpu, self.pid, self.environ = gpu, pid, environ
        self.nvml = SimulatedNvml(gpu, pid, environ)
        with gpu.transaction() as state:
            state["clients"].setdefault(str(pid), {"reserved": 0, "outside": 0})

    # torch.cuda's calls

    def mem_get_info(self, device: object = None) -> tuple[int, int]:
        """(free, total): within the pinned limit under MPS, else the device's."""
        _check_device(device)
        with self.gpu.transaction() as state:
            limit = self._limit(state)
            if limit is not None:
                return max(0, limit - _held(state, self.pid)), limit
            return state["total"] - _device_used(state), state["total"]

    def memory_reserved(self, device: object = None) -> int:
        _check_device(device)
        with self.gpu.transaction() as state:
            return state["clients"][str(self.pid)]["reserved"]

    # the process's allocations

    def create_context(self, nbytes: int = CONTEXT_BYTES) -> None:
        self.allocate(nbytes, outside_torch=True)

    def allocate(self, nbytes: int, *, outside_torch: bool = False) -> None:
        """Raises torch.cuda.OutOfMemoryError past the client's pinned limit (under a running
        MPS server) or past the device's free memory; nothing changes then."""
        with self.gpu.transaction() as state:
            limit, total = self._limit(state), state["total"]
            if limit is not None and _held(state, self.pid) + nbytes > limit:
                raise _out_of_memory(nbytes, limit, limit - _held(state, self.pid), "pinned limit")
            if _device_used(state) + nbytes > total:
                raise _out_of_memory(nbytes, total, total - _device_used(state), "device")
            state["clients"][str(self.pid)][_kind(outside_torch)] += nbytes

    def free(self, nbytes: int, *, outside_torch: bool = False) -> None:
        with self.gpu.transaction() as state:
            entry = state["clients"][str(self.pid)]
            assert entry[_kind(outside_torch)] >= nbytes, "freeing more than was allocated"
            entry[_kind(outside_torch)] -= nbytes

    def exit(self) -> None:
        """The process ends: the driver takes back all it held."""
        with self.gpu.transaction() as state:
            state["clients"].pop(str(self.pid), None)

    def held(self) -> int:
        with self.gpu.transaction() as state:
            return _held(state, self.pid)

    def _limit(self, state: dict[str, Any]) -> int | None:
        if not state["mps_server"]:
            return None
        return mps_pinned_limit(self.environ.get(MPS_LIMIT_ENV), 0)


class SimulatedNvml:
    """NVML as one client process sees it (the runner's ProcessNvml)."""

    def __init__(self, gpu: SimulatedGpu, pid: int, environ: Mapping[str, str]) -> None:
        self.gpu, self.pid, self.environ = gpu, pid, environ

    def read(self, cuda_index: int) -> NvmlReading:
        assert cuda_index == 0, f"the simulated GPU is CUDA device 0, not {cuda_index}"
        with self.gpu.transaction() as state:
            offset = HOST_PID_OFFSET if state["host_pids"] else 0
            processes = {  # those with a context: the ones holding memory
                int(pid) + offset: _held(state, int(pid)) if state["per_process_memory"] else None
                for pid in state["clients"]
                if _held(state, int(pid))
            }
            reserve = 0 if state["mig"] else DRIVER_RESERVED_BYTES
            return NvmlReading(
                card_total=state["card"],
                is_mig=state["mig"],
                used=_device_used(state) + reserve,
                processes=processes,
            )


def _held(state: dict[str, Any], pid: int) -> int:
    entry = state["clients"].get(str(pid), {"reserved": 0, "outside": 0})
    return entry["reserved"] + entry["outside"]


def _device_used(state: dict[str, Any]) -> int:
    return sum(_held(state, int(pid)) for pid in state["clients"])


def _kind(outside_torch: bool) -> str:
    return "outside" if outside_torch else "reserved"


def _check_device(device: object) -> None:
    index = torch.device(device).index if isinstance(device, str) else device
    index = getattr(index, "index", index)
    assert index in (None, 0), f"the simulated GPU is CUDA device 0, asked for {device!r}"


def _out_of_memory(nbytes: int, total: int, free: int, bound: str) -> torch.cuda.OutOfMemoryError:
    return torch.cuda.OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {nbytes // MIB} MiB. GPU 0 has a total capacity"
        f" of {total // MIB} MiB ({bound}) of which {max(0, free) // MIB} MiB is free."
    )
