"""Keeps this node's ResourceSlices equal to its GPUs.

Each round reads the GPUs; when the pool they make differs from the one last written, it is
written at a new generation: slices created or updated, stale ones of this driver and node
deleted. What the API server answers is what it stored, and a disabled alpha gate drops its
fields silently: when the answer lacks them, the gate is off, the driver says which, and the
pool is written again without them (whole GPUs, static MIG devices), for good.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from dra_driver.slices import Features, build_slices, dropped_gates, without
from infergrid.inventory import Gpu

log = logging.getLogger(__name__)

FIRST_RETRY_S = 1.0
LAST_RETRY_S = 60.0
INTERVAL_S = 30.0
"""How often the GPUs are read again: MIG changes and lost GPUs show within this."""


class SliceApi(Protocol):
    def list_slices(self, node: str) -> list[dict]: ...
    def create_slice(self, body: dict) -> dict: ...
    def replace_slice(self, body: dict) -> dict: ...
    def delete_slice(self, name: str) -> None: ...


def _content(slices: Sequence[dict]) -> list[dict]:
    """The slices without their generation: what decides whether the pool changed."""
    return [
        {**s, "spec": {**s["spec"], "pool": {**s["spec"]["pool"], "generation": 0}}} for s in slices
    ]


class SlicePublisher:
    def __init__(
        self, api: SliceApi, node: str, owner: dict | None, features: Features | None = None
    ) -> None:
        self.api = api
        self.node = node
        self.owner = owner
        self.features = features or Features()
        self._written: list[dict] | None = None
        self._generation = 0

    def publish(self, gpus: Sequence[Gpu]) -> bool:
        """Writes the pool if it changed; True when it wrote."""
        desired = build_slices(self.node, gpus, self.features, 0, self.owner)
        if self._written == _content(desired):
            return False
        existing = {s["metadata"]["name"]: s for s in self.api.list_slices(self.node)}
        generations = [s["spec"]["pool"].get("generation", 0) for s in existing.values()]
        self._generation = max([self._generation, *generations]) + 1
        desired = build_slices(self.node, gpus, self.features, self._generation, self.owner)
        self._written = None
        stored = [self._write(body, existing.get(body["metadata"]["name"])) for body in desired]
        for name in sorted(set(existing) - {b["metadata"]["name"] for b in desired}):
            self.api.delete_slice(name)
            log.info("deleted stale ResourceSlice %s", name)
        off = dropped_gates(desired, stored)
        if off:
            self.features = without(self.features, off)
            log.warning(
                "the API server dropped the fields of %s: the feature gate is off, so this node "
                "offers whole GPUs and static MIG devices only; publishing again without them",
                " and ".join(sorted(off)),
            )
            return self.publish(gpus)
        self._written = _content(desired)
        log.info(
            "published %d ResourceSlice(s) of node %s at generation %d (%s)",
            len(desired), self.node, self._generation, self.features,
        )  # fmt: skip
        return True

    def _write(self, body: dict, current: dict | None) -> dict:
        if current is None:
            return self.api.create_slice(body)
        version = current["metadata"].get("resourceVersion")
        metadata = {**body["metadata"], "resourceVersion": version}
        return self.api.replace_slice({**body, "metadata": metadata})

    def run(
        self,
        read_gpus: Callable[[], Sequence[Gpu]],
        stop: threading.Event,
        interval_s: float = INTERVAL_S,
    ) -> None:
        """Publishes every ``interval_s`` until ``stop``; a failed round is retried sooner,
        from 1 s doubling to 60 s, so a restarting API server is not hammered."""
        retry = FIRST_RETRY_S
        while not stop.is_set():
            try:
                self.publish(read_gpus())
                wait, retry = interval_s, FIRST_RETRY_S
            except Exception as err:
                log.warning("publishing ResourceSlices failed, retrying in %.0fs: %s", retry, err)
                wait, retry = retry, min(retry * 2, LAST_RETRY_S)
            stop.wait(wait)
