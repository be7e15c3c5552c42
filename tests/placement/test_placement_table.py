"""The per-GPU placement table: who holds how much of which GPU, and what the extender
would still offer on it."""

import re
from dataclasses import replace

from infergrid.placement_table import GpuRow, Holder, gpu_rows, render

from .builders import (
    L4_MIB,
    NODE,
    NOW,
    STALE_AFTER,
    gpu,
    held_mig,
    held_share,
    held_whole,
    inventory,
    usage,
)


def rows_for(assignments: dict, used: dict | None = None, fresh: bool = True) -> list[GpuRow]:
    inv = inventory(gpu(0), gpu(1), gpu(2, memory=81920, mig=("3g.40gb", "3g.40gb")))
    usages = {NODE: usage(inv, used)} if fresh else {}
    return gpu_rows([inv], usages, assignments, NOW, STALE_AFTER)


def test_each_holder_is_listed_with_its_memory_and_cores_and_free_memory_is_what_is_left():
    rows = rows_for({"ns/a": held_share(0, 8192, 30), "ns/b": held_share(0, 4096, 20)})
    assert rows[0].holders == (Holder("ns/a", "share", 8192, 30), Holder("ns/b", "share", 4096, 20))
    assert rows[0].free_mib == L4_MIB - 12288
    assert rows[1] == GpuRow(NODE, 1, "NVIDIA L4", L4_MIB, L4_MIB, (), "")


def test_whole_gpus_and_mig_instances_name_their_kind():
    rows = rows_for({"ns/w": held_whole(0, 1), "ns/m": held_mig("MIG-2-0", 2)})
    assert [h.kind for h in rows[0].holders] == ["whole"]
    assert [h.kind for h in rows[1].holders] == ["whole"]
    assert rows[2].holders == (Holder("ns/m", "mig:3g.40gb", 40192, 0),)
    assert rows[2].free_mib == 40192  # the untaken instance


def test_holders_of_a_time_sliced_gpu_are_listed_as_time_slices():
    inv = replace(inventory(gpu(0), gpu(1)), time_slices=2)
    held = {"ns/a": held_whole(0, name="a"), "ns/b": held_whole(0, 1, name="b")}
    rows = gpu_rows([inv], {NODE: usage(inv)}, held, NOW, STALE_AFTER)
    assert [[(h.pod, h.kind) for h in row.holders] for row in rows] == [
        [("ns/a", "time-slice"), ("ns/b", "time-slice")],
        [("ns/b", "time-slice")],
    ]
    assert [row.free_mib for row in rows] == [0, 0]


def test_measured_use_outside_assignments_shrinks_free_memory_as_in_the_extender():
    rows = rows_for({"ns/a": held_share(0, 2048, 10)}, used={0: 6000})
    assert rows[0].free_mib == L4_MIB - 6000


def test_a_node_without_fresh_usage_offers_nothing():
    rows = rows_for({}, fresh=False)
    assert [(row.free_mib, row.note) for row in rows] == [(0, "no fresh usage")] * 3
    assert re.search(rf" 0 +{L4_MIB} +no fresh usage$", render(rows).splitlines()[1])


def test_render_puts_one_line_per_holder_and_the_gpu_columns_on_the_first():
    lines = render(rows_for({"ns/a": held_share(0, 8192, 30), "ns/b": held_share(0, 4096, 0)}))
    lines = lines.splitlines()
    assert lines[1].split()[:6] == [NODE, "0", "NVIDIA", "L4", "ns/a", "share"]
    assert lines[2].split() == ["ns/b", "share", "4096", "-"]
    assert len(lines) == 1 + 2 + 1 + 1
