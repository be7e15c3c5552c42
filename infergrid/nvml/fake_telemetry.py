"""How a fake GPU behaves under load: the fake NVML's telemetry, as pure functions of it.

A board per model family (idle and maximum power, clocks, link widths) turns the load
the fake was given (memory in use, utilisation) into what a GPU of that model would
read, near enough for dashboards and reports to show something true to form: power
climbs from idle towards the board's limit with utilisation and is capped there (the
SM clock then drops, with the power-cap reason), temperature follows power, the SM
clock idles with the GPU, and PCIe and NVLink traffic grow with the load. The same load
always reads the same. What real NVML withholds, the fake withholds (None): NVLink on
a GPU without NVLinks (a PCIe L4 or T4), utilisation of a GPU in MIG mode, and the
processes of a MIG-enabled GPU but through its instances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from infergrid.constants import LINK_NVLINK
from infergrid.gpu_models import short_name
from infergrid.inventory import Gpu, MigInstance
from infergrid.nvml.backend import GpuProcess, MigTelemetry, Telemetry

_GB: Final = 10**9


@dataclass(frozen=True, slots=True)
class Board:
    """What one model of GPU draws, how it clocks, and how wide its links are (per direction)."""

    idle_watts: float
    max_watts: float
    idle_sm_mhz: int
    max_sm_mhz: int
    memory_mhz: int
    pcie_bytes_per_second: int
    nvlink_bytes_per_second: int
    """Per NVLink."""


BOARDS: Final = {
    "h100": Board(70.0, 700.0, 345, 1980, 2619, 50 * _GB, 25 * _GB),
    "a100": Board(55.0, 400.0, 210, 1410, 1593, 25 * _GB, 25 * _GB),
    "l4": Board(16.0, 72.0, 210, 2040, 6251, 25 * _GB, 0),
    "t4": Board(10.0, 70.0, 300, 1590, 5001, 12 * _GB, 0),
}
"""Boards by model family, as the short model name starts ("a100-80gb")."""
GENERIC: Final = Board(50.0, 300.0, 300, 1500, 2000, 25 * _GB, 25 * _GB)
"""The board of a model the table lacks."""

DEMAND_AT_FULL_LOAD: Final = 1.1
"""A fully busy GPU would draw this much of its power limit; the cap holds it at the limit."""
AMBIENT_CELSIUS: Final = 30
HEAT_CELSIUS: Final = 55
"""How far above ambient a GPU runs at its power limit."""
MEMORY_BANDWIDTH_PER_UTILIZATION: Final = 0.75
"""Inference is bound by memory: the memory interface is busy most of the time a kernel runs."""
PCIE_TX_SHARE: Final = 0.02
PCIE_RX_SHARE: Final = 0.05
NVLINK_SHARE: Final = 0.1
"""Fractions of a link's width a fully busy GPU moves: inputs in, outputs out, and peers'
tensor-parallel traffic over NVLink."""
REASON_GPU_IDLE: Final = 0x1
REASON_POWER_CAP: Final = 0x4
"""NVML's clocks-event reason bits for an idle GPU and a software power cap."""
PID_BASE: Final = 4000
"""The fake's processes are numbered from here: 100 per GPU, its instances after it."""


def board_of(gpu: Gpu) -> Board:
    family = short_name(gpu.model, gpu.memory_mib).split("-")[0]
    return BOARDS.get(family, GENERIC)


def nvlink_bytes_per_second(gpu: Gpu, utilization_percent: int) -> float | None:
    """What GPU ``gpu`` sends (and receives) over its NVLinks per second; None without any."""
    links = max((link.count for link in gpu.links if link.type == LINK_NVLINK), default=0)
    if not links:
        return None
    width = board_of(gpu).nvlink_bytes_per_second * links
    return width * NVLINK_SHARE * utilization_percent / 100


def reading(
    gpu: Gpu, used_mib: int, utilization_percent: int, nvlink_bytes: int | None
) -> Telemetry:
    """GPU ``gpu``'s telemetry under this load; ``nvlink_bytes`` is what its links moved so far."""
    board = board_of(gpu)
    busy = utilization_percent / 100
    demand = board.idle_watts + (board.max_watts - board.idle_watts) * busy * DEMAND_AT_FULL_LOAD
    power = min(demand, board.max_watts)
    idle = utilization_percent == 0
    reasons = (REASON_GPU_IDLE if idle else 0) | (REASON_POWER_CAP if demand > power else 0)
    mig = gpu.mig_enabled
    return Telemetry(
        utilization_percent=None if mig else utilization_percent,
        memory_bandwidth_percent=(
            None if mig else round(utilization_percent * MEMORY_BANDWIDTH_PER_UTILIZATION)
        ),
        memory_used_mib=used_mib,
        power_watts=round(power, 1),
        power_limit_watts=board.max_watts,
        temperature_celsius=round(AMBIENT_CELSIUS + HEAT_CELSIUS * power / board.max_watts),
        sm_clock_mhz=board.idle_sm_mhz if idle else round(board.max_sm_mhz * power / demand),
        memory_clock_mhz=board.memory_mhz,
        throttle_reasons=reasons,
        pcie_tx_bytes_per_second=round(board.pcie_bytes_per_second * PCIE_TX_SHARE * busy),
        pcie_rx_bytes_per_second=round(board.pcie_bytes_per_second * PCIE_RX_SHARE * busy),
        nvlink_tx_bytes=nvlink_bytes,
        nvlink_rx_bytes=nvlink_bytes,
        processes=None if mig else _processes(gpu.index, 0, used_mib),
        mig=tuple(
            MigTelemetry(instance.uuid, used, _processes(gpu.index, slot, used))
            for slot, (instance, used) in enumerate(
                zip(gpu.mig_instances, split_by_size(used_mib, gpu.mig_instances), strict=True),
                start=1,
            )
        ),
    )


def split_by_size(used_mib: int, instances: tuple[MigInstance, ...]) -> list[int]:
    """A MIG GPU's memory in use, spread over its instances by their size; the sum is kept."""
    total = sum(m.memory_mib for m in instances)
    if not total:
        return [0 for _ in instances]
    shares = [used_mib * m.memory_mib // total for m in instances]
    shares[0] += used_mib - sum(shares)
    return shares


def _processes(index: int, slot: int, used_mib: int) -> tuple[GpuProcess, ...]:
    """One process holding all the memory in use of a GPU (slot 0) or instance; none when idle."""
    return (GpuProcess(PID_BASE + 100 * index + slot, used_mib),) if used_mib else ()
