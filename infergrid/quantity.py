"""Kubernetes quantities that count whole things: GPUs, share slots, MiB of GPU memory.

The API server keeps extended-resource quantities in canonical form, so a pod that
asks for ``infergrid.io/gpu-memory: 20000`` comes back as ``20k``, and a node with
1000 share slots reports ``1k``. Every reader of such an amount parses it here.

The grammar is Kubernetes' own (``resource.Quantity``)::

    quantity ::= [+-] number suffix
    number   ::= digits | digits "." [digits] | "." digits
    suffix   ::= "" | n u m k M G T P E        (powers of 1000)
               | Ki Mi Gi Ti Pi Ei             (powers of 1024)
               | ("e" | "E") [+-] digits       (a power of 10)

The value is worked out exactly (integers and ``Fraction``, never floats) and must
be a whole number from 0 to 2^63-1, the largest amount Kubernetes holds. A string
longer than ``LONGEST`` characters, or an exponent far outside that range, is
refused before any big number is built, so hostile input costs nothing.
"""

import math
import re
from fractions import Fraction
from typing import Final

from infergrid.errors import ContractError

LARGEST: Final = 2**63 - 1
"""The largest quantity Kubernetes holds (int64). Kubernetes caps larger ones; we refuse them."""

LONGEST: Final = 64
"""Characters a quantity may have; any whole number up to ``LARGEST`` needs far fewer."""

_QUANTITY: Final = re.compile(
    r"(?P<sign>[+-]?)(?P<whole>[0-9]*)(?:\.(?P<fraction>[0-9]*))?"
    r"(?:(?P<binary>[KMGTPE]i)|[eE](?P<exponent>[+-]?[0-9]+)|(?P<decimal>[numkMGTPE]?))"
)
_DECIMAL_POWERS: Final = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}  # fmt: skip
_BINARY_POWERS: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}

# Past these powers of ten a non-zero mantissa of at most LONGEST digits, times at
# most 2^60, is certainly above LARGEST, or certainly between 0 and 1.
_TOO_LARGE_POWER: Final = len(str(LARGEST))
_TOO_SMALL_POWER: Final = -(LONGEST + len(str(2**60)))


def parse_whole_quantity(raw: object, path: str) -> int:
    """The whole number a Kubernetes quantity denotes, from 0 to ``LARGEST``.

    ``raw`` is a quantity string (``"2"``, ``"20k"``, ``"1Ki"``, ``"5e3"``, ``"1.5k"``) or a
    JSON integer. Fractions (``"1.5"``, ``"100m"``), negatives, amounts above ``LARGEST``
    and anything that is not a quantity raise a ContractError for ``path``.
    """
    return _parse(raw, path, milli=False)


def parse_milli_quantity(raw: object, path: str) -> int:
    """Thousandths of a Kubernetes quantity, rounded up as Kubernetes' ``MilliValue`` does:
    CPU in millicores (``"100m"`` is 100, ``"1.5"`` 1500, ``"2"`` 2000), up to ``LARGEST``."""
    return _parse(raw, path, milli=True)


def _parse(raw: object, path: str, milli: bool) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return _in_range(raw, raw * 1000 if milli else raw, path)
    if not isinstance(raw, str):
        raise ContractError(path, f"expected a quantity such as '2' or '20k', got {raw!r}")
    if len(raw) > LONGEST:
        raise ContractError(
            path, f"is {len(raw)} characters long; a quantity has at most {LONGEST} here"
        )
    match = _QUANTITY.fullmatch(raw)
    if match is None or not (match["whole"] or match["fraction"]):
        raise ContractError(
            path, f"{raw!r} is not a Kubernetes quantity (digits, then k, Mi, e3 or the like)"
        )
    return _in_range(raw, _value(match, raw, path, milli), path)


def _value(match: re.Match[str], raw: str, path: str, milli: bool) -> int:
    """The match's exact value (in thousandths, rounded up, with ``milli``), when it is a
    whole number of sane size."""
    fraction = match["fraction"] or ""
    mantissa = int((match["whole"] + fraction).lstrip("0") or "0")
    if mantissa == 0:
        return 0  # "0", "-0", "0.000Ki" and "0e99" are all zero
    if match["sign"] == "-":
        raise ContractError(path, f"{raw!r} is negative")
    if match["binary"]:
        power_of_two, power_of_ten = _BINARY_POWERS[match["binary"]], 0
    elif match["exponent"] is not None:
        power_of_two, power_of_ten = 0, int(match["exponent"])
    else:
        power_of_two, power_of_ten = 0, _DECIMAL_POWERS[match["decimal"]]
    power_of_ten -= len(fraction) - (3 if milli else 0)
    if power_of_ten >= _TOO_LARGE_POWER:
        raise ContractError(path, _too_large(raw))
    if power_of_ten < _TOO_SMALL_POWER:
        if milli:
            return 1  # a positive sliver, rounded up
        raise ContractError(path, _not_whole(raw))
    value = mantissa * 2**power_of_two * Fraction(10) ** power_of_ten
    if milli:
        return math.ceil(value)
    if value.denominator != 1:
        raise ContractError(path, _not_whole(raw))
    return value.numerator


def _in_range(raw: object, value: int, path: str) -> int:
    if value < 0:
        raise ContractError(path, f"{raw!r} is negative")
    if value > LARGEST:
        raise ContractError(path, _too_large(raw))
    return value


def _too_large(raw: object) -> str:
    return f"{raw!r} is above {LARGEST} (2^63-1), the largest quantity Kubernetes holds"


def _not_whole(raw: str) -> str:
    return f"{raw!r} is not a whole number"
