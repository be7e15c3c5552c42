"""Tensor parallelism: which heads and MLP columns each rank holds, and its collectives.

Megatron's split of a Llama block across `size` ranks: q, k and v (one fused projection) are
split by head, column-parallel, so each rank attends over its own heads and keeps only their
KV cache; `o_proj` is split by input column (row-parallel), so each rank's output is a partial
sum that one all-reduce completes. The MLP likewise: gate and up by column, down by row, one
all-reduce. Embedding, norms and the LM head are whole on every rank. Two all-reduces a layer
is all the communication a step needs.

KV heads are split as evenly as they go (SmolLM2's 3 over 2 ranks: 2 and 1) and each query
head stays with the KV head it reads, so a model whose head counts do not divide by `size`
still splits; fewer KV heads than ranks cannot, and is refused naming the setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Protocol

import torch
import torch.distributed as dist

from infergrid.errors import ContractError

TP_FIELD: Final = "tensor_parallel_size"


@dataclass(frozen=True, slots=True)
class TensorParallel:
    """This process's place in the group: rank `rank` of `size` (1: no parallelism)."""

    rank: int = 0
    size: int = 1
    group: Any = None  # the torch.distributed process group, when size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks in place (the row-parallel layers' partial outputs)."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def min(self, value: int) -> int:
        """The smallest `value` any rank has: what every rank can hold (KV blocks)."""
        if self.size == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.group)
        return int(tensor.item())


SINGLE: Final = TensorParallel()


class Followers(Protocol):
    """Ranks 1..size-1, as rank 0's runner sees them (`tp_workers.TPWorkers`)."""

    tp: TensorParallel  # rank 0's place in their group
    failed: str | None  # why, once one of them exited unasked

    def close(self) -> None: ...


def share(total: int, size: int, rank: int) -> range:
    """Rank `rank`'s contiguous part of `total` items split as evenly as they go, the larger
    parts first."""
    base, extra = divmod(total, size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


def kv_heads(num_kv_heads: int, tp: TensorParallel) -> range:
    if num_kv_heads < tp.size:
        raise ContractError(
            TP_FIELD,
            f"{tp.size} ranks need at least as many KV heads; the model has {num_kv_heads}",
        )
    return share(num_kv_heads, tp.size, tp.rank)


def query_heads(num_heads: int, num_kv_heads: int, tp: TensorParallel) -> range:
    """The query heads that read this rank's KV heads (GQA groups stay whole)."""
    group = num_heads // num_kv_heads
    kv = kv_heads(num_kv_heads, tp)
    return range(kv.start * group, kv.stop * group)


def mlp_columns(intermediate_size: int, tp: TensorParallel) -> range:
    return share(intermediate_size, tp.size, tp.rank)


def rows_of(heads: range, head_dim: int) -> slice:
    """The weight rows (or columns) of these heads."""
    return slice(heads.start * head_dim, heads.stop * head_dim)


def send_step(tp: TensorParallel, step: tuple[torch.Tensor, Any] | None) -> None:
    """Rank 0: hand one step's inputs (token ids and attention metadata; None: stop) to the
    other ranks, which run the same forward pass in lockstep."""
    if tp.size > 1:
        dist.broadcast_object_list([_to_cpu(step)], src=0, group=tp.group)


def receive_step(tp: TensorParallel, device: torch.device) -> tuple[torch.Tensor, Any] | None:
    """The other ranks: the next step rank 0 sent, its tensors on `device`."""
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0, group=tp.group)
    return _to_device(box[0], device)


def _to_cpu(step: Any) -> Any:
    return _map_tensors(step, lambda t: t.cpu())


def _to_device(step: Any, device: torch.device) -> Any:
    return _map_tensors(step, lambda t: t.to(device))


def _map_tensors(value: Any, fn) -> Any:
    """`fn` over every tensor of a step: a tuple, or a slots dataclass of tensors and ints."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple):
        return tuple(_map_tensors(v, fn) for v in value)
    fields = {name: getattr(value, name) for name in value.__slots__}
    return type(value)(**{k: _map_tensors(v, fn) if isinstance(v, torch.Tensor) else v
                          for k, v in fields.items()})  # fmt: skip
