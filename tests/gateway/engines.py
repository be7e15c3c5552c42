"""Real `infergrid-engine` processes behind an in-process gateway, for the gateway's tests."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

from gateway.app import Gateway, Scaler
from gateway.catalog import Backend, Catalog, Route
from gateway.config import GatewayConfig
from gateway.live_catalog import LiveCatalog
from gateway.main import start_site
from harness.engine_process import EngineProcess, free_port, requests_seen
from harness.tiny_model_dir import write_tiny_model
from infergrid.tracks import STABLE

MODEL = "tiny"
# A gateway without keys whose one anonymous tenant has no limits, for the tests that send
# many requests and are about something else.
OPEN = GatewayConfig(
    allow_anonymous=True, anonymous_requests_per_s=math.inf, anonymous_burst=math.inf,
    anonymous_tokens_per_minute=math.inf, anonymous_max_concurrent=1 << 30,
)  # fmt: skip


def start_engines(tmp: Path, count: int) -> list[EngineProcess]:
    model = write_tiny_model(tmp / "tiny", max_positions=2048)
    args = ["--model", str(model), "--model-name", MODEL, "--kv-cache-memory", "32MiB",
            "--cpu-threads", "1"]  # fmt: skip
    engines = [EngineProcess(args, tmp / f"engine-{i}.log") for i in range(count)]
    for engine in engines:
        engine.wait_ready()
    return engines


def backend(engine: EngineProcess, track: str = STABLE, n: int = 0) -> Backend:
    pod = f"tiny-{'canary-' if track != STABLE else ''}5d4f7c9b8-{'bcdfg'[n:] + 'bcdfg'[:n]}"
    return Backend("ml", pod, engine.url, track)


def route(backends: Sequence[Backend], canary: int = 0, replicas: int = 1) -> Route:
    return Route(MODEL, "ml", "tiny", canary, replicas, tuple(backends))


@asynccontextmanager
async def gateway_serving(
    catalog: Catalog, cfg: GatewayConfig | None = None, scaler: Scaler | None = None
) -> AsyncIterator[tuple[Gateway, str]]:
    """The gateway's app on a free port, routing by `catalog`; yields it and its URL."""
    cfg = replace(cfg or OPEN, host="127.0.0.1", port=free_port())
    live = LiveCatalog(asyncio.get_running_loop())
    live.set(catalog)
    gateway = Gateway(cfg, live, scaler=scaler)
    runner = await start_site(gateway.app(), cfg.host, cfg.port)  # as infergrid-gateway serves
    try:
        yield gateway, f"http://{cfg.host}:{cfg.port}"
    finally:
        await runner.cleanup()


async def reached(session, engine: EngineProcess) -> float:
    """Requests that reached an engine, however they ended, from its own /metrics."""
    async with session.get(f"{engine.url}/metrics") as response:
        return requests_seen(await response.text())
