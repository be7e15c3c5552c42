"""The real engine server on a thread of the test process, on a free port.

Loads the model through the same `load` the console script uses and serves with the same
`start_site`; only the process boundary is missing (test_drain covers that). Tests talk to
it over real HTTP, and may run coroutines on its event loop (`call`) to reach the engine.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any

import torch

from batching_engine.config import Settings
from batching_engine.loading import load
from batching_engine.metrics import EngineMetrics
from batching_engine.server.app import EngineServer, start_site


class ServerThread:
    def __init__(self, settings: Settings, *, warm_up: bool = True) -> None:
        self.settings = settings
        self.warm_up = warm_up  # False: loaded and started, but not yet ready
        self.loop = asyncio.new_event_loop()
        self.server: EngineServer | None = None
        self.port = 0
        self._site: Any = None
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="test-server", daemon=True
        )

    def __enter__(self) -> ServerThread:
        self._torch_threads = torch.get_num_threads()  # load() sets it for the process
        self._thread.start()
        self.call(self._start()).result(timeout=120)
        return self

    def __exit__(self, *exc: object) -> None:
        self.call(self._stop()).result(timeout=120)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()
        torch.set_num_threads(self._torch_threads)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, coro: Coroutine[Any, Any, Any]) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def _start(self) -> None:
        metrics = EngineMetrics()
        s = self.settings
        self.server = EngineServer(
            s.engine, metrics, s.max_body_bytes, s.read_timeout_s, s.caller_token
        )
        self._site = await start_site(self.server, "127.0.0.1", 0)
        self.port = self._site.addresses[0][1]
        model, engine = load(self.settings, metrics)
        self.server.start(model, engine)
        if self.warm_up:
            await self.server.warm_up()

    async def _stop(self) -> None:
        assert self.server is not None
        await self.server.drain()
        await self.server.close()
        await self._site.cleanup()
