"""The gateway as a process of its own in front of engine processes, for its fuzzer.

`infergrid-gateway` learns its routes from the Kubernetes API; this runs the same `Gateway`
app, listeners (`gateway.main.start_site`) and SIGTERM drain (`gateway.main.drain`) with a
fixed route instead, to the engine URLs given, and one tenant key with no limits, so what
the fuzzer meets is the gateway's own checks and the engines' answers relayed:

    python -m tests.fuzzing.gateway_process --port P --metrics-port M --key K URL [URL ...]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
from dataclasses import replace

from gateway.app import Gateway
from gateway.catalog import Backend, Catalog
from gateway.live_catalog import LiveCatalog
from gateway.main import drain, start_site
from gateway.tenants import KeyTable, TenantLimits
from infergrid.tracks import STABLE
from tests.gateway.engines import OPEN, route

UNLIMITED = TenantLimits(
    "fuzz", requests_per_s=math.inf, burst=math.inf, tokens_per_minute=math.inf,
    max_concurrent=1 << 30,
)  # fmt: skip
DRAIN_S = 5.0


def catalog(urls: list[str]) -> Catalog:
    """One service, `ml/tiny`, with a stable pod per engine URL."""
    backends = [Backend("ml", f"tiny-{i}", url, STABLE) for i, url in enumerate(urls)]
    return Catalog.of(route(backends, replicas=len(backends)))


async def serve(port: int, metrics_port: int, key: str, urls: list[str]) -> None:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    cfg = replace(
        OPEN, host="127.0.0.1", port=port, metrics_host="127.0.0.1", metrics_port=metrics_port,
        api_keys_secret="fuzz/keys", drain_s=DRAIN_S,
    )  # fmt: skip
    live = LiveCatalog(loop)
    live.set(catalog(urls))
    gateway = Gateway(cfg, live)
    gateway.keys = KeyTable.of({key: UNLIMITED})
    runners = [await start_site(gateway.app(), cfg.host, port),
               await start_site(gateway.metrics_app(), cfg.host, metrics_port)]  # fmt: skip
    await stopping.wait()
    await drain(gateway, cfg.drain_s)
    for runner in runners:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("urls", nargs="+")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.metrics_port, args.key, args.urls))


if __name__ == "__main__":
    main()
