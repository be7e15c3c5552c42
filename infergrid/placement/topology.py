"""Which free GPUs to give a pod that asks for several whole ones.

Tensor-parallel inference talks between its GPUs every layer, so the set should
be NVLink-connected when the pod requires it and as well-connected as possible
when it does not; then on one NUMA node; then touching as few NVLinks of the
GPUs left behind, so a later multi-GPU pod still finds a connected set.
"""

from collections.abc import Iterator, Sequence
from itertools import combinations
from math import comb
from typing import Final

from infergrid.placement.state import GpuState

EXHAUSTIVE_SETS: Final = 256
"""Up to this many candidate sets every one is tried (8 GPUs give at most 70);
beyond it, one greedy set grown from each GPU, which keeps 16-GPU nodes fast."""

_SetKey = tuple[int, int, int, tuple[int, ...]]


def choose_gpu_set(
    free: Sequence[GpuState], count: int, nvlink_required: bool
) -> tuple[GpuState, ...] | None:
    """The best ``count`` GPUs of ``free`` (index order), or None when no set qualifies.

    Best is, in order: most NVLinks inside the set, fewest NUMA nodes, fewest
    NVLinks to the free GPUs left out, lowest indices. With ``nvlink_required``
    every pair in the set must be NVLink-connected.
    """
    if count < 1 or count > len(free):
        return None
    weights = [[a.nvlinks(b.index) for b in free] for a in free]
    degree = [sum(row) for row in weights]
    if comb(len(free), count) <= EXHAUSTIVE_SETS:
        sets: Iterator[tuple[int, ...]] = combinations(range(len(free)), count)
    else:
        sets = _greedy_sets(free, weights, count, nvlink_required)
    best: tuple[_SetKey, tuple[int, ...]] | None = None
    for members in sets:
        key = _set_key(members, free, weights, degree, nvlink_required)
        if key is not None and (best is None or key < best[0]):
            best = (key, members)
    return None if best is None else tuple(free[i] for i in best[1])


def largest_nvlink_set(free: Sequence[GpuState]) -> int:
    """The size of the largest all-pairs NVLink-connected set in ``free``; for messages."""
    for size in range(len(free), 1, -1):
        if choose_gpu_set(free, size, nvlink_required=True) is not None:
            return size
    return min(1, len(free))


def _set_key(
    members: tuple[int, ...],
    free: Sequence[GpuState],
    weights: list[list[int]],
    degree: list[int],
    nvlink_required: bool,
) -> _SetKey | None:
    """Sort key of one set (lower is better), or None when it breaks the NVLink requirement."""
    inside = 0
    for at, a in enumerate(members):
        row = weights[a]
        for b in members[at + 1 :]:
            if nvlink_required and not row[b]:
                return None
            inside += row[b]
    numa_nodes = len({free[i].numa_node for i in members})
    to_rest = sum(degree[i] for i in members) - 2 * inside
    return (-inside, numa_nodes, to_rest, tuple(free[i].index for i in members))


def _greedy_sets(
    free: Sequence[GpuState], weights: list[list[int]], count: int, nvlink_required: bool
) -> Iterator[tuple[int, ...]]:
    """From each GPU, add the candidate with most NVLinks into the set, same NUMA first."""
    for seed in range(len(free)):
        members = [seed]
        while len(members) < count:
            allowed = [
                c
                for c in range(len(free))
                if c not in members and (not nvlink_required or all(weights[c][m] for m in members))
            ]
            if not allowed:
                break
            members.append(
                max(
                    allowed,
                    key=lambda c: (
                        sum(weights[c][m] for m in members),
                        free[c].numa_node == free[seed].numa_node,
                        -c,
                    ),
                )
            )
        if len(members) == count:
            yield tuple(sorted(members))
