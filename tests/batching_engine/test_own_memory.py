"""What an engine holds outside torch, measured for its own process only (own_memory.py)."""

from __future__ import annotations

import pytest

from batching_engine.own_memory import (
    DeviceMemory,
    NvmlReading,
    OwnMemory,
    check_device_room,
    isolated_view,
    mps_pinned_limit,
    nvml_device_key,
    own_memory,
)
from infergrid.errors import ContractError

MIB = 1 << 20
GIB = 1 << 30
CARD = 80 * GIB
NVML_CARD = CARD + 512 * MIB  # NVML counts the driver's reserve; CUDA's total does not
PID = 4242


def device(*, reserved: int, ours_outside: int, others: int, total: int = CARD) -> DeviceMemory:
    """CUDA's device-wide view: our torch reserve and outside memory, and the neighbours'."""
    return DeviceMemory(
        free=total - reserved - ours_outside - others, total=total, reserved=reserved
    )


def nvml(used: int, processes: dict[int, int | None] | None = None, **kw) -> NvmlReading:
    return NvmlReading(card_total=kw.get("card", NVML_CARD), is_mig=kw.get("mig", False),
                       used=used, processes=processes or {})  # fmt: skip


def measure(memory: DeviceMemory, reading: NvmlReading | None, **kw) -> OwnMemory:
    return own_memory(
        memory,
        reading,
        pid=PID,
        baseline_used=kw.get("baseline"),
        mps_limit=kw.get("mps_limit"),
        nvml_missing=kw.get("missing", ""),
    )


def test_nvmls_figure_for_our_pid_is_all_we_hold_so_outside_torch_is_the_rest():
    memory = device(reserved=3 * GIB, ours_outside=400 * MIB, others=20 * GIB)
    reading = nvml(0, {PID: 3 * GIB + 400 * MIB, 77: 20 * GIB})
    own = measure(memory, reading)
    assert own == OwnMemory(400 * MIB, f"NVML's used memory of pid {PID}")


def test_without_our_pid_the_rise_since_the_baseline_is_ours():
    """Inside a container NVML lists host pids: the device's rise since before our context."""
    memory = device(reserved=3 * GIB, ours_outside=400 * MIB, others=20 * GIB)
    reading = nvml(used=25 * GIB + 3 * GIB + 400 * MIB, processes={900001: None})
    own = measure(memory, reading, baseline=25 * GIB)
    assert own.outside_torch == 400 * MIB
    assert f"pid {PID} is not listed" in own.method and "since before" in own.method


def test_a_pid_listed_without_a_figure_also_falls_back_to_the_baseline():
    reading = nvml(used=10 * GIB + GIB + 300 * MIB, processes={PID: None})
    memory = device(reserved=GIB, ours_outside=300 * MIB, others=0)
    own = measure(memory, reading, baseline=10 * GIB)
    assert own.outside_torch == 300 * MIB and "has no memory figure" in own.method


def test_a_neighbour_that_allocated_since_the_baseline_is_counted_as_ours():
    """An over-estimate: the engine starts smaller, never bigger than its share."""
    reading = nvml(used=10 * GIB + GIB + 300 * MIB + 2 * GIB)
    own = measure(device(reserved=GIB, ours_outside=300 * MIB, others=12 * GIB), reading,
                  baseline=10 * GIB)  # fmt: skip
    assert own.outside_torch == 300 * MIB + 2 * GIB


def test_a_neighbour_that_freed_since_the_baseline_is_clamped_to_what_torch_holds():
    """The rise can be less than torch's reserve; we hold at least that, outside is then 0."""
    reading = nvml(used=10 * GIB - 5 * GIB + GIB)
    own = measure(device(reserved=GIB, ours_outside=300 * MIB, others=5 * GIB), reading,
                  baseline=10 * GIB)  # fmt: skip
    assert own.outside_torch == 0


@pytest.mark.parametrize(
    ("reading", "kw", "why"),
    [
        (None, {"missing": "nvmlInit: Driver Not Loaded"}, "NVML is unavailable (nvmlInit"),
        (nvml(0, {}), {}, "no baseline"),
    ],
)
def test_without_nvml_or_a_baseline_the_device_wide_view_is_flagged(reading, kw, why):
    """The old arithmetic, neighbours included: safe (never over a share), and said."""
    memory = device(reserved=GIB, ours_outside=300 * MIB, others=5 * GIB)
    own = measure(memory, reading, **kw)
    assert own.outside_torch == 5 * GIB + 300 * MIB
    assert own.neighbours_included and why in own.method


@pytest.mark.parametrize(
    ("memory", "reading", "kw", "why"),
    [
        (  # MIG: CUDA sees the 10 GiB instance; other instances are not in its numbers
            device(total=10 * GIB, reserved=GIB, ours_outside=600 * MIB, others=0),
            nvml(0, card=None, mig=True),
            {},
            "a MIG instance of 10240 MiB",
        ),
        (  # an MPS client: CUDA's total is its pinned limit, free is the limit less its use
            device(total=4 * GIB, reserved=GIB, ours_outside=500 * MIB, others=0),
            None,
            {"mps_limit": 4 * GIB},
            "an MPS client within its pinned limit of 4096 MiB",
        ),
        (  # a view much smaller than the card NVML reports
            device(total=20 * GIB, reserved=GIB, ours_outside=500 * MIB, others=0),
            nvml(60 * GIB),
            {},
            "CUDA reports 20480 MiB of the card's 82432 MiB",
        ),
    ],
)
def test_an_isolated_view_is_trusted_before_nvml(memory, reading, kw, why):
    own = measure(memory, reading, **kw)
    assert own.outside_torch == memory.used - memory.reserved
    assert own.method == f"isolated view: {why}" and not own.neighbours_included


def test_a_whole_card_is_not_mistaken_for_a_slice_for_the_drivers_reserve():
    """CUDA's total is a few hundred MiB under NVML's on a whole card."""
    assert isolated_view(CARD, nvml(0), None) is None
    assert isolated_view(CARD, nvml(0), mps_limit=4 * GIB) is None  # the limit is not in force


def test_a_device_with_room_for_what_torch_still_needs_passes():
    memory = device(reserved=GIB, ours_outside=300 * MIB, others=70 * GIB)
    check_device_room(4 * GIB, GIB + 3 * GIB, memory, OwnMemory(300 * MIB, "x"))


def test_an_over_committed_device_is_refused_with_every_number():
    """A 4 GiB share on an 80 GiB card where neighbours already hold 80000 MiB."""
    memory = device(reserved=GIB, ours_outside=300 * MIB, others=80000 * MIB)
    with pytest.raises(ContractError) as refused:
        check_device_room(3686 * MIB, 3386 * MIB, memory, OwnMemory(300 * MIB, "x"))
    assert str(refused.value) == (
        "memory_budget_bytes: the device cannot give this engine its budget of 3686 MiB: it"
        " still needs 2362 MiB on top of the 1324 MiB it holds, but 596 MiB are free and other"
        " processes hold 80000 MiB (an over-committed GPU, or a share larger than the MPS"
        " pinned limit)"
    )


@pytest.mark.parametrize(
    ("value", "index", "limit"),
    [
        ("0=4096M", 0, 4096 * MIB),
        ("0=4096M,1=2G", 1, 2 * GIB),
        ("1=2G", 0, None),
        ("4096M", 3, 4096 * MIB),
        (" 0=1g ", 0, GIB),
        ("", 0, None),
        (None, 0, None),
    ],
)
def test_mps_pinned_limits_are_read_per_device(value, index, limit):
    assert mps_pinned_limit(value, index) == limit


@pytest.mark.parametrize("value", ["4096", "0=4T", "x=4G", "0=", "0=4096MiB"])
def test_an_unreadable_mps_limit_names_the_variable(value):
    with pytest.raises(ContractError, match="^CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: expected"):
        mps_pinned_limit(value, 0)


@pytest.mark.parametrize(
    ("visible", "index", "key"),
    [
        (None, 1, 1),
        ("", 0, 0),
        ("3,1", 1, 1),
        ("3,1", 0, 3),
        ("GPU-8a1b, GPU-77cd", 1, "GPU-77cd"),
        ("MIG-5c6d7e8f-0000-1111-2222-333344445555", 0, "MIG-5c6d7e8f-0000-1111-2222-333344445555"),
        ("MIG-GPU-8a1b/1/0", 0, None),  # the pre-R470 form NVML cannot look up
        ("0", 1, None),  # CUDA sees one device
    ],
)
def test_cuda_visible_devices_maps_cudas_index_to_nvmls_device(visible, index, key):
    assert nvml_device_key(visible, index) == key
