"""Times and durations as a report's user writes and reads them: durations as Prometheus writes
them (``90s``, ``5m``, ``1h30m``, ``7d``), times as RFC 3339 or Unix seconds, shown in UTC."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Final

from infergrid.errors import ContractError

_UNITS: Final = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
_PART: Final = re.compile(r"([0-9]+)(ms|[wdhms])")
_DURATION: Final = re.compile(r"(?:[0-9]+(?:ms|[wdhms]))+")
_NUMBER: Final = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def parse_duration(text: str, field: str) -> float:
    """Seconds in ``text``: a number of seconds, or units as Prometheus writes them."""
    text = text.strip()
    if _DURATION.fullmatch(text):
        seconds = sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(text))
    elif _NUMBER.fullmatch(text):
        seconds = float(text)
    else:
        raise ContractError(field, f"{text!r} is not a duration like 90s, 5m or 1h")
    if not seconds > 0:
        raise ContractError(field, f"must be above 0 seconds, got {text!r}")
    return seconds


def parse_time(text: str, field: str) -> float:
    """Unix seconds of ``text``: RFC 3339 with a timezone, or Unix seconds."""
    if _NUMBER.fullmatch(text.strip()):
        return float(text)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ContractError(field, f"{text!r} is not an RFC 3339 time or Unix seconds") from None
    if moment.tzinfo is None:
        raise ContractError(field, f"{text!r} has no timezone; use Z for UTC")
    return moment.timestamp()


def show_time(seconds: float) -> str:
    """RFC 3339 in UTC, to the second."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def show_duration(seconds: float) -> str:
    """``1h30m``, ``45s``: the largest units first, whole seconds."""
    left, parts = round(seconds), []
    for unit in ("d", "h", "m", "s"):
        count, left = divmod(left, _UNITS[unit])
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"
