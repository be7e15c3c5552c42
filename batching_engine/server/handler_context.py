"""What the request handlers need of the server, and nothing more.

`generation`, `embeddings` and `warm_up` take a HandlerContext rather than the EngineServer
that routes to them: they no longer import the app that imports them, and a handler's
signature says all it can touch. `EngineServer` is the one implementation.
"""

from __future__ import annotations

from typing import Protocol

from batching_engine.async_engine import AsyncEngine
from batching_engine.dynamic_batcher import DynamicBatcher
from batching_engine.metrics import EngineMetrics
from batching_engine.server.served_model import ServedModel


class HandlerContext(Protocol):
    """The served model, the engine and the batcher, each a 503 (NotReadyError) while it is
    not there; the metrics a handler counts its refusals in; the engine's priority classes;
    how long a request's body may take to arrive."""

    @property
    def metrics(self) -> EngineMetrics: ...

    @property
    def priority_levels(self) -> int: ...

    @property
    def read_timeout_s(self) -> float: ...

    def require_model(self) -> ServedModel: ...

    def require_engine(self) -> AsyncEngine: ...

    def require_batcher(self) -> DynamicBatcher[list[int], list[float]]: ...
