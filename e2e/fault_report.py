"""What a fault under load did, counted per request or pod, in one shape for every fault.

Each fault test drives a steady load, injects its fault, and tallies every request or pod
it started by how it ended. The test asserts on the tally (nothing lost); `bench/faults.py`
runs the same tests at a chosen load and prints the tallies as the table of docs/operations.md. When
`INFERGRID_FAULT_REPORTS` names a folder, `publish` writes each report there as JSON.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path

REPORTS_ENV = "INFERGRID_FAULT_REPORTS"
LOAD_ENV = "INFERGRID_FAULT_LOAD"
"""A multiplier on each fault test's load (1 in `make test`; bench/faults.py raises it)."""

OUTCOMES = ("answered", "refused", "failed_in_flight", "lost")
"""- answered: served (a 2xx, a stream to its end, a pod bound and running);
- refused: ended with a status the client can act on (a 4xx/5xx with a body, a stream's
  error event, a pod left Pending with a scheduling event);
- failed_in_flight: cut off while it ran on the component that was killed, with an error
  the client sees (a reset connection, a stream ended by an error event);
- lost: accepted and then never answered, nor refused: what must stay 0."""


def load_scale() -> int:
    """How many times the default load a fault test runs at."""
    return max(1, int(os.environ.get(LOAD_ENV, "1")))


@dataclass
class Tally:
    """Outcomes counted from the load's threads; `recovery_s` is the fault's own figure
    (time from injection to the first success after it, or to the standby leading)."""

    fault: str
    load: str
    outcomes: Counter[str] = field(default_factory=Counter)
    recovery_s: float | None = None
    seen: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, outcome: str) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}")
        with self._lock:
            self.outcomes[outcome] += 1

    @property
    def sent(self) -> int:
        return sum(self.outcomes.values())

    def as_dict(self) -> dict[str, object]:
        # Not dataclasses.asdict: it deep-copies every field, and a lock cannot be copied.
        out = {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
        out["outcomes"] = {k: self.outcomes.get(k, 0) for k in OUTCOMES}
        out["sent"] = self.sent
        return out


def publish(tally: Tally) -> None:
    """Writes the tally where bench/faults.py collects it, when it asked."""
    folder = os.environ.get(REPORTS_ENV)
    if folder:
        path = Path(folder) / f"{tally.fault.replace(' ', '-')}.json"
        path.write_text(json.dumps(tally.as_dict(), indent=1))
