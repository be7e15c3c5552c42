"""The engine's HTTP API (aiohttp): routes, probes, metrics, its OpenAPI document (openapi.py),
and the error boundary.

The server answers before the model is loaded (liveness passes, readiness does not) and
while it drains (readiness fails, accepted requests finish, new ones get a 503). Handlers
are cancelled when their client disconnects (`handler_cancellation`), which is how a
generation handler learns to abort its request. The endpoints themselves live in
`generation` and `embeddings`; failures become JSON in `errors`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial

from aiohttp import web

from batching_engine.async_engine import AsyncEngine
from batching_engine.config import DEFAULT_MAX_BODY_BYTES, DEFAULT_READ_TIMEOUT_S, EngineConfig
from batching_engine.dynamic_batcher import BatchPolicy, DynamicBatcher
from batching_engine.metrics import EngineMetrics
from batching_engine.server.caller_token import token_check
from batching_engine.server.embeddings import embed_batch, embeddings
from batching_engine.server.errors import NotReadyError, error_response, http_error_response
from batching_engine.server.generation import generate
from batching_engine.server.openapi import DOCUMENT
from batching_engine.server.responses import models_response
from batching_engine.server.served_model import ServedModel
from batching_engine.server.warm_up import warm_up
from infergrid import openapi

_LINGERING_S = 10.0  # aiohttp's default
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class EngineServer:
    """The aiohttp application around one AsyncEngine and one embedding batcher.

    It routes requests to the handlers in `generation` and `embeddings` and is the
    `HandlerContext` they are given.
    """

    def __init__(
        self,
        config: EngineConfig,
        metrics: EngineMetrics,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        caller_token: str = "",
    ) -> None:
        self.config = config
        self.caller_token = caller_token  # "": /v1/* open to any caller (caller_token.py)
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.read_timeout_s = read_timeout_s  # for a request's headers, and for its body
        self.model: ServedModel | None = None
        self.engine: AsyncEngine | None = None
        self.batcher: DynamicBatcher[list[int], list[float]] | None = None
        self.draining = False
        self.warmed = False  # one request answered since the model loaded (warm_up.py)
        self._in_flight = 0  # requests to /v1/ not yet answered
        self._quiet = asyncio.Event()
        self._quiet.set()

    def app(self) -> web.Application:
        middlewares = [token_check(self.caller_token), self._errors]  # refused before counted
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=middlewares)
        app.router.add_post("/v1/completions", partial(generate, self, chat=False))
        app.router.add_post("/v1/chat/completions", partial(generate, self, chat=True))
        app.router.add_post("/v1/embeddings", partial(embeddings, self))
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_get(openapi.OPENAPI_PATH, openapi.handler(DOCUMENT))
        return app

    # Lifecycle.

    def start(self, model: ServedModel, engine: AsyncEngine) -> None:
        """The model is loaded: start the worker and the batcher; `warm_up` turns readiness on."""
        engine.start()
        batcher = DynamicBatcher(self._batch_policy(), partial(embed_batch, engine, model.runner))
        batcher.start()
        self.metrics.track_state(
            queue_depth=lambda: engine.queue_depth + batcher.queue_depth,
            running=lambda: engine.num_running,
            kv_usage=lambda: engine.kv_usage,
        )
        self.engine, self.batcher, self.model = engine, batcher, model

    async def warm_up(self) -> float:
        """One request to the end, then readiness turns true; its seconds (warm_up.py)."""
        seconds = await warm_up(self)
        self.warmed = True
        return seconds

    def _batch_policy(self) -> BatchPolicy:
        c = self.config
        return BatchPolicy(
            max_batch_size=c.max_batch_size,
            preferred_batch_sizes=c.preferred_batch_sizes,
            max_queue_delay_s=c.max_queue_delay_ms / 1000,
            max_queue_size=c.max_queue_size,
            queue_timeout_s=c.queue_timeout_s,
        )

    @property
    def ready(self) -> bool:
        alive = self.engine is not None and self.engine.alive
        return self.model is not None and self.warmed and not self.draining and alive

    async def drain(self) -> None:
        """Readiness off, no new requests; returns once every accepted one is answered."""
        self.draining = True
        if self.engine is not None:
            await self.engine.drain()
        if self.batcher is not None:
            await self.batcher.close()
        await self._quiet.wait()

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()
        if self.model is not None:
            await asyncio.to_thread(self.model.runner.close)

    # What endpoints need; each raises NotReadyError (a 503) when it is not there.

    def require_model(self) -> ServedModel:
        """The model, for a new request: none while loading or draining."""
        if self.draining:
            raise NotReadyError("the engine is draining")
        if self.model is None:
            raise NotReadyError("the model is still loading")
        return self.model

    def require_engine(self) -> AsyncEngine:
        if self.engine is None:
            raise NotReadyError("the model is still loading")
        return self.engine

    def require_batcher(self) -> DynamicBatcher[list[int], list[float]]:
        if self.batcher is None:
            raise NotReadyError("the model is still loading")
        return self.batcher

    @property
    def priority_levels(self) -> int:
        return self.config.priority_levels

    # Probes, metrics, models.

    async def healthz(self, request: web.Request) -> web.Response:
        """Alive unless the worker thread died; loading and draining are healthy."""
        if self.engine is not None and not self.engine.alive:
            return web.json_response({"status": "engine worker stopped"}, status=503)
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        if self.ready:
            return web.json_response({"status": "ready"})
        reason = (
            "draining" if self.draining
            else "loading" if self.model is None
            else "warming up" if not self.warmed
            else "stopped"
        )  # fmt: skip
        return web.json_response({"status": reason}, status=503)

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), content_type="text/plain")

    async def models(self, request: web.Request) -> web.Response:
        """Answers while draining too: listing the model accepts no work."""
        if self.model is None:
            raise NotReadyError("the model is still loading")
        model = self.model
        return web.json_response(models_response(model.name, model.created, model.max_model_len))

    # The error boundary, which also counts requests in flight for the drain.

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        counted = request.path.startswith("/v1/")
        if counted:
            self._in_flight += 1
            self._quiet.clear()
        try:
            return await handler(request)
        except web.HTTPException as err:
            if err.status < 400:
                raise
            return http_error_response(err, self.metrics, self.max_body_bytes)
        except Exception as err:
            return error_response(err, self.metrics)
        finally:
            if counted:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._quiet.set()


async def start_site(server: EngineServer, host: str, port: int) -> web.AppRunner:
    """Listen on host:port (0: any free port; see `runner.addresses`).

    The read timeout bounds every wait on a client (`body.py`): a connection that has not
    sent a whole request within it is closed, and so is one whose unread body (after an
    early refusal, or a 408) still trickles in: aiohttp's lingering, 10 s by default.
    """
    runner = web.AppRunner(
        server.app(),
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=server.read_timeout_s,
        lingering_time=min(_LINGERING_S, server.read_timeout_s),
    )
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
