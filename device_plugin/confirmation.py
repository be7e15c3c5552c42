"""After Allocate answers: learn from the kubelet which pod got the devices, then mark it.

The kubelet records a grant only once Allocate has returned, so this runs in
a thread and asks PodResources a few times, briefly. The `allocated` mark goes
to the pod the kubelet shows holding the devices, never to a guess that may be
another pod; only when the kubelet cannot say at all is the guess marked, as
before PodResources was read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Final

from device_plugin import metrics
from device_plugin.allocator import Grant
from device_plugin.manager import DeviceManager

log = logging.getLogger(__name__)

ATTEMPTS: Final = 10
INTERVAL_S: Final = 0.3

OnGrants = Callable[[list[Grant]], None]


class Confirmer:
    """Called with each Allocate's grants; hands `on_grants` each grant with its true holder."""

    def __init__(
        self,
        manager: DeviceManager,
        on_grants: OnGrants,
        attempts: int = ATTEMPTS,
        interval_s: float = INTERVAL_S,
    ):
        self.manager = manager
        self.on_grants = on_grants
        self.attempts = attempts
        self.interval_s = interval_s

    def __call__(self, grants: list[Grant]) -> None:
        threading.Thread(target=self.confirm, args=(grants,), daemon=True).start()

    def confirm(self, grants: Sequence[Grant]) -> None:
        """Marks each grant's holder as soon as the kubelet shows it, within the attempts."""
        left = list(grants)
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(self.interval_s)
            holders = self.manager.confirm(left)
            if holders is None:
                metrics.POD_RESOURCES_FALLBACKS.labels("mark").inc()
                log.warning("marking the plugin's guess allocated: PodResources did not answer")
                self.on_grants(left)
                return
            shown = [replace(g, pending=h) for g, h in zip(left, holders, strict=True) if h]
            if shown:
                self.on_grants(shown)
            left = [g for g, h in zip(left, holders, strict=True) if h is None]
            if not left:
                return
        for g in left:
            log.warning(
                "the kubelet never showed devices %s held; no pod is marked allocated for them",
                ", ".join(g.device_ids),
            )
