"""Choosing a set of whole GPUs: NVLink first, then NUMA, then what is left behind."""

from itertools import combinations

from infergrid.placement import choose_gpu_set
from infergrid.placement.topology import largest_nvlink_set

from .builders import gpu, held_whole, inventory, node_of


def free_gpus(inv, holders=()):
    return [g for g in node_of(inv, holders).gpus if g.takes_whole()]


def indices(chosen):
    return None if chosen is None else [g.index for g in chosen]


def full_mesh(indices_, links=12):
    return {pair: links for pair in combinations(indices_, 2)}


# DGX-1 (V100) hybrid cube-mesh: two fully linked quads, plus i <-> i+4.
CUBE_MESH = inventory(
    *(gpu(i, numa=i // 4) for i in range(8)),
    nvlink=full_mesh(range(4), 1) | full_mesh(range(4, 8), 1) | {(i, i + 4): 1 for i in range(4)},
)


def test_an_nvswitch_node_gives_the_lowest_gpus_on_one_numa_node():
    inv = inventory(*(gpu(i, numa=i // 4) for i in range(8)), nvlink=full_mesh(range(8)))
    assert indices(choose_gpu_set(free_gpus(inv), 4, nvlink_required=True)) == [0, 1, 2, 3]


def test_a_cube_mesh_quad_is_found_and_a_broken_one_avoided():
    assert indices(choose_gpu_set(free_gpus(CUBE_MESH), 4, True)) == [0, 1, 2, 3]
    busy = free_gpus(CUBE_MESH, [held_whole(0)])
    assert indices(choose_gpu_set(busy, 4, True)) == [4, 5, 6, 7]
    busy = free_gpus(CUBE_MESH, [held_whole(0, 5)])
    assert choose_gpu_set(busy, 4, True) is None
    assert largest_nvlink_set(busy) == 3


def test_one_gpu_is_taken_from_outside_an_nvlink_pair():
    inv = inventory(gpu(0), gpu(1), gpu(2), nvlink={(0, 1): 4})
    assert indices(choose_gpu_set(free_gpus(inv), 1, False)) == [2]


def test_a_large_node_uses_the_greedy_search():
    inv = inventory(
        *(gpu(i, numa=i // 8) for i in range(16)),
        nvlink=full_mesh(range(8)) | full_mesh(range(8, 16)),
    )
    free = free_gpus(inv, [held_whole(0)])
    assert indices(choose_gpu_set(free, 8, True)) == list(range(8, 16))
    assert indices(choose_gpu_set(free, 7, True)) == list(range(1, 8))
    assert choose_gpu_set(free, 9, True) is None
    assert indices(choose_gpu_set(free, 9, False)) == [1, *range(8, 16)]


def test_impossible_counts_give_none():
    free = free_gpus(inventory(gpu(0), gpu(1)))
    assert choose_gpu_set(free, 3, False) is None
    assert choose_gpu_set(free, 0, False) is None
    assert largest_nvlink_set([]) == 0
    assert largest_nvlink_set(free) == 1
