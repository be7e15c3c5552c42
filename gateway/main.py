"""`infergrid-gateway`: one OpenAI endpoint for every InferenceService.

infergrid-gateway [--config FILE] [--port 8080] [--metrics-port 9090] [--namespaces a,b]
    [--api-keys-secret NAMESPACE/NAME | --allow-anonymous]

Keys are required: without --api-keys-secret the gateway refuses to start, unless
--allow-anonymous opens it to every caller as one bounded tenant (--anonymous-* limits).

SIGTERM drains: /readyz turns 503 so the Service stops sending new requests, requests
still arriving are served (each answer closing its connection, so clients reconnect to a
replica still ready), and the process exits once none is in flight. After --drain seconds,
what is still in flight is ended with what its client can act on: a stream with an error
event, a request whose answer has not begun with a 503 to retry.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import threading

from aiohttp import web
from kubernetes import client, config

from gateway.app import Gateway
from gateway.config import SETTINGS, GatewayConfig, check
from gateway.kube import CatalogFeed, KeysSecretGone, read_keys, scale_up
from gateway.live_catalog import LiveCatalog
from gateway.tenants import KeyTable
from infergrid.engine_token import with_key
from infergrid.errors import ContractError
from infergrid.process import configure_logging, kube_api
from infergrid.settings import add_flags, load_settings

KEEPALIVE_S = 30.0
log = logging.getLogger("infergrid.gateway")
QUIET_S = 1.0  # after SIGTERM, at least this long before exiting with nothing in flight
CUT_OFF_S = 2.0  # after the drain, time for the requests cut off to send their last words


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="infergrid-gateway", description=__doc__)
    add_flags(parser, SETTINGS)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        cfg = with_key(check(load_settings(GatewayConfig(), SETTINGS, args)))
        api = kube_api()
    except (ContractError, OSError, config.ConfigException) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    asyncio.run(serve(cfg, api))
    return 0


async def serve(cfg: GatewayConfig, api: client.ApiClient) -> None:
    loop = asyncio.get_running_loop()
    stop, stopping = threading.Event(), asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    live = LiveCatalog(loop)

    async def scaler(namespace: str, name: str) -> bool:
        return await asyncio.to_thread(scale_up, api, namespace, name)

    gateway = Gateway(cfg, live, scaler=scaler)
    feed = CatalogFeed(live.publish)
    feed.start(api, cfg.namespaces, stop)
    runners = [await start_site(gateway.app(), cfg.host, cfg.port)]
    if cfg.metrics_port:
        runners.append(await start_site(gateway.metrics_app(), cfg.metrics_host, cfg.metrics_port))
    keys = asyncio.ensure_future(_refresh_keys(gateway, api)) if cfg.secret else None
    log.info("serving the OpenAI API on %s:%d, metrics on %s:%d", cfg.host, cfg.port,
             cfg.metrics_host, cfg.metrics_port)  # fmt: skip
    if cfg.secret is None:
        log.warning("no API keys: every caller is the anonymous tenant, limited only by the "
                    "anonymous* settings (allowAnonymous is on)")  # fmt: skip
    await stopping.wait()
    await drain(gateway, cfg.drain_s)
    stop.set()
    if keys is not None:
        keys.cancel()
    for runner in runners:
        await runner.cleanup()


async def drain(gateway: Gateway, limit_s: float) -> None:
    """Readiness off, then wait for the requests in flight (new ones are still served);
    those still in flight after `limit_s` are cut off (Gateway.cut_off), never dropped."""
    gateway.draining = True
    log.info("draining: %d requests in flight", gateway.in_flight)
    loop = asyncio.get_running_loop()
    began = loop.time()
    while loop.time() - began < limit_s:
        if gateway.in_flight == 0 and loop.time() - began >= min(QUIET_S, limit_s):
            break
        await asyncio.sleep(0.1)
    if gateway.in_flight:
        log.warning("drain over; ending %d requests still in flight", gateway.in_flight)
        tasks = gateway.cut_off()
        if tasks:
            await asyncio.wait(tasks, timeout=CUT_OFF_S)
    log.info("drained; %d requests still in flight", gateway.in_flight)


async def start_site(app: web.Application, host: str, port: int) -> web.AppRunner:
    # A client that goes away cancels its handler, so its upstream request is closed and
    # the engine stops generating for nobody; an idle kept-alive connection lasts 30 s.
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, handler_cancellation=True,
        keepalive_timeout=KEEPALIVE_S,
    )  # fmt: skip
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def _refresh_keys(gateway: Gateway, api: client.ApiClient) -> None:
    """Reads the keys Secret now and every secretRefreshSeconds. A bad or unreadable Secret
    keeps the last good table (and, before the first, keeps the gateway unready), with the
    field named; a deleted one revokes every key, as deleting it means."""
    assert gateway.cfg.secret is not None
    namespace, name = gateway.cfg.secret
    last_error = ""
    while True:
        try:
            gateway.keys = await asyncio.to_thread(read_keys, api, namespace, name)
            last_error = ""
        except KeysSecretGone as err:
            if gateway.keys is not None:  # before a first table, the gateway stays unready
                gateway.keys = KeyTable({})
            if str(err) != last_error:
                log.error("API keys revoked: %s", err)
            last_error = str(err)
        except ContractError as err:
            if str(err) != last_error:
                log.error("API keys not (re)loaded: %s", err)
            last_error = str(err)
        await asyncio.sleep(gateway.cfg.secret_refresh_s)


if __name__ == "__main__":
    sys.exit(main())
