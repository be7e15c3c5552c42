"""CUDA graphs for decode steps: capture once per batch size of a ladder, then replay.

A decode step launches a few kernels per layer, each taking microseconds of GPU time but tens of
microseconds of Python and driver time to launch; a graph replays them all with one launch. A
graph is frozen to its tensors' addresses and shapes, so the runner captures one graph per batch
size of a ladder (1, 2, 4, 8, 16, 32, ...), each reading fixed input buffers, and runs a batch of
n on the smallest captured size >= n with the extra rows padded so they do nothing: slot -1
(no KV write), context length 0 (attention reads nothing) and block tables of -1.

Capture needs kernels that never sync with the host, i.e. the Triton path; the torch reference
syncs (it reads lengths back), so graphs are only used when dispatch takes the Triton path.
Anything else (CPU, a batch past the top of the ladder, wider block tables than captured, a
capture that failed) runs eagerly: same results, only slower.

The ladder choice and the padding are plain functions, tested on CPU; so is the replay logic,
through the `capture` seam (the default, CudaGraphCapture, records a real CUDA graph).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from . import dispatch

log = logging.getLogger(__name__)

Forward = Callable[..., torch.Tensor]
# What one captured graph is to the runner: replay it, then read its output buffer.
Capture = Callable[[Forward, Mapping[str, torch.Tensor]], tuple[Callable[[], None], torch.Tensor]]

# How to pad each decode input so a padded row does nothing (names are the forward's keywords).
DECODE_PAD_VALUES: dict[str, int] = {
    "input_ids": 0,
    "positions": 0,
    "slot_mapping": -1,
    "context_lens": 0,
    "block_tables": -1,
}


def batch_size_ladder(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to `max_batch_size`, which is always the top."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size: must be at least 1, got {max_batch_size}")
    ladder = [size for size in (1, 2, 4, 8) if size < max_batch_size]
    ladder += list(range(16, max_batch_size, 16))
    return [*ladder, max_batch_size]


def graph_batch_size(ladder: Sequence[int], batch_size: int) -> int | None:
    """The smallest rung that holds `batch_size`, or None past the top (run eagerly)."""
    fitting = [size for size in ladder if size >= batch_size]
    return min(fitting) if fitting else None


def fill_static(
    static: torch.Tensor, value: torch.Tensor, pad_value: float, batch_size: int
) -> None:
    """Copy `value` into the first rows (and columns) of `static[:batch_size]`; pad the rest.

    A 2-D input narrower than its buffer (block tables of a batch with shorter contexts) is
    padded on the right as well.
    """
    target = static[:batch_size]
    rows = value.shape[0]
    if value.dim() == 2 and value.shape[1] < static.shape[1]:
        target[:rows, value.shape[1] :].fill_(pad_value)
        target = target[:, : value.shape[1]]
    target[:rows].copy_(value)
    static[rows:batch_size].fill_(pad_value)


def fits(static: Mapping[str, torch.Tensor], inputs: Mapping[str, torch.Tensor]) -> bool:
    """Whether every input fits its buffer past dimension 0 (e.g. block tables no wider)."""
    if set(inputs) != set(static):
        raise ValueError(f"inputs {sorted(inputs)} are not the captured {sorted(static)}")
    for name, value in inputs.items():
        buffer = static[name]
        if value.dim() != buffer.dim() or value.dtype != buffer.dtype:
            raise ValueError(
                f"{name}: {value.dtype} with {value.dim()} dims, captured as {buffer.dtype} "
                f"with {buffer.dim()}"
            )
        if any(v > b for v, b in zip(value.shape[1:], buffer.shape[1:], strict=True)):
            return False
    return True


class CudaGraphCapture:
    """The real capture: warm up on a side stream (Triton compiles on its first call), then
    record one graph. Every graph of one DecodeGraphs shares a memory pool: only one runs at a
    time."""

    def __init__(self) -> None:
        self.pool: tuple[int, int] | None = None

    def __call__(
        self, forward: Forward, inputs: Mapping[str, torch.Tensor]
    ) -> tuple[Callable[[], None], torch.Tensor]:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            forward(**inputs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = forward(**inputs)
        return graph.replay, output


@dataclass
class _Graph:
    replay: Callable[[], None]
    output: torch.Tensor


class DecodeGraphs:
    """Decode steps through captured graphs, eager where no graph fits.

    `forward(**inputs)` must read only from `inputs` (and the model's own persistent state, such
    as weights and the KV cache) and return a tensor with one row per sequence. `static` holds one
    buffer per input, sized for the top of the ladder (and for the widest block table).
    """

    def __init__(
        self,
        forward: Forward,
        static: Mapping[str, torch.Tensor],
        ladder: Sequence[int],
        pad_values: Mapping[str, float] = DECODE_PAD_VALUES,
        capture: Capture | None = None,
    ) -> None:
        missing = set(static) - set(pad_values)
        if missing:
            raise ValueError(f"pad_values: no pad value for inputs {sorted(missing)}")
        self.forward = forward
        self.static = dict(static)
        self.ladder = sorted(ladder)
        self.pad_values = dict(pad_values)
        self._capture = capture if capture is not None else CudaGraphCapture()
        self.graphs: dict[int, _Graph] = {}

    @staticmethod
    def available(device: torch.device) -> bool:
        """Graphs need a CUDA device and the Triton path there (the torch path syncs)."""
        if device.type != "cuda":
            return False
        return dispatch.uses_triton(torch.empty(0, device=device))

    def capture_all(self) -> bool:
        """Capture every rung, largest first; on any failure drop them all and stay eager."""
        for size in sorted(self.ladder, reverse=True):
            inputs = self._padded_static(size)
            try:
                replay, output = self._capture(self.forward, inputs)
            except Exception as error:  # a capture that fails must not take the engine down
                log.warning("CUDA graph capture failed at batch %d; eager decode: %s", size, error)
                self.graphs.clear()
                return False
            self.graphs[size] = _Graph(replay, output)
        return True

    def run(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """forward(**inputs), through the smallest captured graph that fits, else eagerly.

        A replayed result is a view of the graph's output buffer: the next run overwrites it.
        """
        batch_size = next(iter(inputs.values())).shape[0]
        size = graph_batch_size(self.ladder, batch_size)
        graph = self.graphs.get(size) if size is not None else None
        if graph is None or not fits(self.static, inputs):
            return self.forward(**inputs)
        for name, value in inputs.items():
            fill_static(self.static[name], value, self.pad_values[name], size)
        graph.replay()
        return graph.output[:batch_size]

    def _padded_static(self, size: int) -> dict[str, torch.Tensor]:
        """The buffers cut to `size` rows, every row a padding row (what capture runs on)."""
        inputs = {}
        for name, buffer in self.static.items():
            buffer.fill_(self.pad_values[name])
            inputs[name] = buffer[:size]
        return inputs
