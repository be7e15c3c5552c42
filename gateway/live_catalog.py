"""The catalog the event loop routes by, replaced whole whenever a watch sees a change.

Watches run in threads; they hand a new `Catalog` over with `publish`, which the loop picks
up in its own thread. Requests held for a pod wait on `changed()`, which wakes every waiter
at the next publish.
"""

from __future__ import annotations

import asyncio

from gateway.catalog import Catalog


class LiveCatalog:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.current = Catalog()
        self.synced = False
        self._changed = asyncio.Event()

    def publish(self, catalog: Catalog) -> None:
        """From any thread."""
        self.loop.call_soon_threadsafe(self.set, catalog)

    def set(self, catalog: Catalog) -> None:
        """On the loop."""
        self.current = catalog
        self.synced = True
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, timeout_s: float) -> None:
        """Returns at the next publish, or after `timeout_s`."""
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await self._changed.wait()
        except TimeoutError:
            pass
