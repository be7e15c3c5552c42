"""One gateway, as the gateway bench measures it: the real app, in a process of its own.

Run by ``bench/gateway.py``, so that the load generator never shares the gateway's event
loop, as a module from the repository root (run as a file, its sibling ``bench/gateway.py``
would shadow the ``gateway`` package). The catalog is set once, from the ``--backend`` flags:
one route, model ``tiny`` of ``bench/tiny``, whose stable-track pods are named as the
operator's Deployment would name them (``tiny-5d4f7c9b8-<suffix>``, the track read back by
``infergrid.tracks``), in the order given. Everything that decides (the split, the balancer,
the proxy, the queue-depth scrape) is ``gateway.app.Gateway``'s own code, with the default
``GatewayConfig`` but for the routing policy; no Kubernetes API is involved. It prints
``{"port": N}`` on one line once it serves, and stops on SIGTERM.

    python -m bench.gateway_server --backend http://127.0.0.1:8001 \
        --backend http://127.0.0.1:8002 [--routing least-loaded|round-robin]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import sys

from aiohttp import web

from gateway.app import Gateway
from gateway.balancer import LEAST_LOADED, POLICIES
from gateway.catalog import Backend, Catalog, Route
from gateway.config import GatewayConfig
from gateway.live_catalog import LiveCatalog
from infergrid.tracks import SAFE_ALPHABET, STABLE, track_of_pod

MODEL = "tiny"
NAMESPACE = "bench"
SERVICE = "tiny"
TEMPLATE_HASH = "5d4f7c9b8"
SUFFIXES = "bcdfghjklmnpqrstvwxz"  # from Kubernetes' safe alphabet


def pod_name(i: int) -> str:
    """The i-th pod of the stable Deployment: `tiny-5d4f7c9b8-bcdfg`, `...-cdfgh`, ..."""
    suffix = (SUFFIXES[i:] + SUFFIXES[:i])[:5]
    name = f"{SERVICE}-{TEMPLATE_HASH}-{suffix}"
    assert set(suffix) <= SAFE_ALPHABET and track_of_pod(SERVICE, name) == STABLE, name
    return name


def catalog(urls: list[str]) -> Catalog:
    backends = tuple(
        Backend(NAMESPACE, pod_name(i), url.rstrip("/"), STABLE) for i, url in enumerate(urls)
    )
    route = Route(MODEL, NAMESPACE, SERVICE, canary_percent=0, replicas=len(backends),
                  backends=backends)  # fmt: skip
    return Catalog.of(route)


async def serve(urls: list[str], routing: str, host: str) -> None:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    cfg = GatewayConfig(host=host, port=0, metrics_port=0, routing=routing,
                        allow_anonymous=True, anonymous_requests_per_s=math.inf,
                        anonymous_burst=math.inf, anonymous_tokens_per_minute=math.inf,
                        anonymous_max_concurrent=1 << 30)  # fmt: skip
    live = LiveCatalog(loop)
    live.set(catalog(urls))
    gateway = Gateway(cfg, live)
    runner = web.AppRunner(gateway.app(), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    print(json.dumps({"port": port}), flush=True)
    await stopping.wait()
    await runner.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", required=True, help="an engine's URL")
    parser.add_argument("--routing", choices=POLICIES, default=LEAST_LOADED)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    asyncio.run(serve(args.backend, args.routing, args.host))
    return 0


if __name__ == "__main__":
    sys.exit(main())
