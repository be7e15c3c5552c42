"""The claims this driver prepared, kept in a file so a restarted driver still knows them.

The kubelet may ask again to prepare a claim it already had prepared (after its own restart)
and asks to unprepare claims after the driver restarted; both need the answer given then,
not one worked out again from a claim that may since have changed or gone.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from dra_driver.cdi import write_atomically

log = logging.getLogger(__name__)

FILE: Final = "checkpoint.json"
VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class GrantedDevice:
    """One device of a prepared claim, as the kubelet was told."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    namespace: str
    name: str
    devices: tuple[GrantedDevice, ...]


class Checkpoint:
    """Prepared claims by uid, written through to ``<pluginDir>/checkpoint.json``."""

    def __init__(self, plugin_dir: Path) -> None:
        self.path = plugin_dir / FILE
        self._lock = threading.Lock()
        self._claims = _load(self.path)

    def get(self, uid: str) -> PreparedClaim | None:
        with self._lock:
            return self._claims.get(uid)

    def uids(self) -> list[str]:
        with self._lock:
            return sorted(self._claims)

    def put(self, uid: str, claim: PreparedClaim) -> None:
        with self._lock:
            self._claims[uid] = claim
            self._save()

    def drop(self, uid: str) -> None:
        with self._lock:
            if self._claims.pop(uid, None) is not None:
                self._save()

    def _save(self) -> None:
        doc = {"version": VERSION, "claims": {u: asdict(c) for u, c in self._claims.items()}}
        write_atomically(self.path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def _load(path: Path) -> dict[str, PreparedClaim]:
    """The saved claims; none, with an error logged, from a file that cannot be read: the
    driver still serves, and unpreparing a claim it forgot removes its CDI spec by uid."""
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("version") != VERSION:
            raise ValueError(f"version {doc.get('version')!r}, want {VERSION}")
        return {uid: _claim(raw) for uid, raw in doc["claims"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        log.error("checkpoint %s is unreadable, starting without it: %s", path, err)
        return {}


def _claim(raw: dict[str, Any]) -> PreparedClaim:
    devices = tuple(
        GrantedDevice(
            request_names=tuple(d["request_names"]),
            pool=d["pool"],
            device=d["device"],
            cdi_ids=tuple(d["cdi_ids"]),
            share_id=d.get("share_id"),
        )
        for d in raw["devices"]
    )
    return PreparedClaim(raw["namespace"], raw["name"], devices)
