"""What a GPU's ECC record says about it: nothing, a fault, or a fault that needs a reset.

Pure: the health tracker asks ``ecc_fault`` at each reading and acts on the answer.
Memory that lost data since the driver loaded (a volatile double-bit count), or a
page or row that waits for a reset to be retired or remapped, or a row that could
not be remapped, is not healed by waiting, as XID 48 is not. The aggregate counts,
retired pages and remapped rows live on the GPU across reboots, so a GPU that
once had a fault, was reset and was trusted again would be unhealthy forever if
their size counted: only growth since the plugin's first reading does.
"""

from dataclasses import dataclass
from typing import Final

from infergrid.inventory import ECC_FIELDS, EccState

_FIELD: Final = {key: name for key, name, _ in ECC_FIELDS}
"""The EccState field of each value, by its inventory name (which reasons show)."""

NEEDS_RESET: Final = ("volatileDoubleBit", "retiredPagesPending", "remapPending", "remapFailed")
"""The values that need a reset when above 0 or true."""

KEPT_COUNTS: Final = ("aggregateDoubleBit", "retiredPagesDoubleBit", "remappedRowsUncorrectable")
"""The counts kept across reboots: a fault when they grew since the first reading."""

MEANING: Final = {
    "volatileDoubleBit": "double-bit errors since the driver loaded",
    "aggregateDoubleBit": "double-bit errors over the GPU's life",
    "retiredPagesDoubleBit": "pages retired for double-bit errors",
    "retiredPagesPending": "a page waits to be retired at the next reset",
    "remappedRowsUncorrectable": "rows remapped for uncorrectable errors",
    "remapPending": "a row waits to be remapped at the next reset",
    "remapFailed": "a row could not be remapped",
}
"""What each value says, for the reasons people read in pod conditions and logs."""


@dataclass(frozen=True, slots=True)
class EccFault:
    """Why an ECC record makes a GPU unhealthy, every reason named with its value."""

    reason: str
    needs_reset: bool


def ecc_fault(first: EccState, now: EccState) -> EccFault | None:
    """The fault in ``now``, the GPU's ECC record, given ``first``, the plugin's first reading.

    None for a healthy record. A value NVML does not support (None) never counts.
    """
    reset = [
        f"ECC {key} is {_shown(value)} ({MEANING[key]})"
        for key in NEEDS_RESET
        if (value := _value(now, key))
    ]
    grown = [
        f"ECC {key} grew from {before} to {after} since the plugin started ({MEANING[key]})"
        for key in KEPT_COUNTS
        if (before := _value(first, key)) is not None
        and (after := _value(now, key)) is not None
        and after > before
    ]
    if not reset and not grown:
        return None
    return EccFault("; ".join(reset + grown), needs_reset=bool(reset))


def _value(ecc: EccState, key: str) -> int | bool | None:
    return getattr(ecc, _FIELD[key])


def _shown(value: int | bool) -> str:
    """A value as the inventory annotation writes it: ``true`` for a flag, digits for a count."""
    return "true" if value is True else str(value)
