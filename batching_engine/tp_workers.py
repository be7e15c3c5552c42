"""The processes of a tensor-parallel engine: rank 0 is the engine itself, ranks 1..N-1 are
workers it starts, one per GPU (or CPU process), as vLLM does.

The scheduler lives in rank 0 only. Each worker builds the same `ModelRunner` with its rank
(so its share of the weights and of the KV heads) and then follows: every step rank 0 runs,
it runs too, and the two all-reduces of each layer meet. torch.distributed carries it all:
NCCL between GPUs, gloo between CPU processes, so CPU tests run 2-way parallelism for real.

A worker that dies must not leave rank 0 waiting. Its sockets close, so a collective in
flight fails at once; a worker that hangs instead fails the collective after
`COLLECTIVE_TIMEOUT_S`; and a monitor thread that sees a worker exit calls `on_failure`,
which the server turns into failed readiness and a non-zero exit.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Final

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from batching_engine.device import use_device
from batching_engine.model.tensor_parallel import TensorParallel
from batching_engine.model_runner import ModelRunner
from infergrid.process import configure_logging

log = logging.getLogger("infergrid.engine")
COLLECTIVE_TIMEOUT_S: Final = 120.0
MONITOR_INTERVAL_S: Final = 0.5


class TPWorkers:
    """Ranks 1..size-1 in child processes, and rank 0's place in their group."""

    def __init__(
        self,
        size: int,
        runner_kwargs: dict[str, Any],
        *,
        on_failure: Callable[[str], None],
        cpu_threads: int = 1,
    ) -> None:
        device = torch.device(runner_kwargs.get("device", "cpu"))
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        self.on_failure = on_failure
        self.failed: str | None = None  # why, once a worker exited unasked
        self._closing = threading.Event()
        # The ranks meet through a file, not a port: nothing to race other processes for.
        self._rendezvous = tempfile.mkdtemp(prefix="infergrid-tp-")
        address = f"file://{self._rendezvous}/group"
        context = mp.get_context("spawn")  # CUDA cannot be forked
        self.processes = [
            context.Process(
                target=_worker_main,
                args=(rank, size, address, self.backend, runner_kwargs, cpu_threads),
                name=f"tp-rank-{rank}",
                daemon=True,
            )
            for rank in range(1, size)
        ]
        for process in self.processes:
            process.start()
            log.info("tensor-parallel %s started (pid %d)", process.name, process.pid)
        _join_group(0, size, address, self.backend)
        self.tp = TensorParallel(0, size, dist.group.WORLD)
        threading.Thread(target=self._monitor, name="tp-monitor", daemon=True).start()

    def close(self) -> None:
        """After rank 0 stopped them (`ModelRunner.stop_followers`): wait, then leave."""
        self._closing.set()
        for process in self.processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
        dist.destroy_process_group()
        shutil.rmtree(self._rendezvous, ignore_errors=True)

    def _monitor(self) -> None:
        while not self._closing.wait(MONITOR_INTERVAL_S):
            for process in self.processes:
                if process.exitcode is not None:
                    self._closing.set()
                    self.failed = (
                        f"tensor-parallel worker {process.name} (pid {process.pid}) exited"
                        f" with {process.exitcode}"
                    )
                    self.on_failure(self.failed)
                    return


def _join_group(rank: int, size: int, address: str, backend: str) -> None:
    timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    dist.init_process_group(backend, init_method=address, rank=rank, world_size=size,
                            timeout=timeout)  # fmt: skip


def _worker_main(
    rank: int,
    size: int,
    address: str,
    backend: str,
    runner_kwargs: dict[str, Any],
    cpu_threads: int,
) -> None:
    """One worker: join the group, build this rank's runner, follow rank 0 until it stops."""
    configure_logging("INFO")
    torch.set_num_threads(cpu_threads)
    kwargs = dict(runner_kwargs)
    if backend == "nccl":
        kwargs["device"] = f"cuda:{rank}"
        use_device(kwargs["device"])
    _join_group(rank, size, address, backend)
    runner = ModelRunner(**kwargs, tp=TensorParallel(rank, size, dist.group.WORLD))
    log.info("tensor-parallel rank %d ready: %d KV blocks", rank, runner.num_kv_blocks)
    runner.follow()
    dist.destroy_process_group()
