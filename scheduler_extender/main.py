"""`infergrid-scheduler-extender`: the HTTP extender that infergrid-scheduler calls.

infergrid-scheduler-extender [--config FILE] [--port 8888] [--no-leader-election]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import ssl
import sys
import threading
from datetime import timedelta

from aiohttp import web
from kubernetes import client, config

from infergrid.errors import ContractError
from infergrid.process import configure_logging, kube_api
from infergrid.settings import add_flags, load_settings
from scheduler_extender.app import ExtenderService
from scheduler_extender.binder import Binder
from scheduler_extender.config import SETTINGS, ExtenderConfig
from scheduler_extender.leader import LeaseElector
from scheduler_extender.pending_binds import BindBarrier
from scheduler_extender.view import PlacementView
from scheduler_extender.watch_cache import ClusterCache

log = logging.getLogger("infergrid.scheduler_extender")


def tls_context(cfg: ExtenderConfig) -> ssl.SSLContext | None:
    if cfg.tls_cert_file is None:
        return None
    if cfg.tls_key_file is None:
        raise ContractError("tlsKeyFile", "is required with tlsCertFile")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cfg.tls_cert_file), str(cfg.tls_key_file))
    return ctx


async def freeze_when_synced(cache: ClusterCache, stop: threading.Event) -> None:
    """A synced cache of thousands of nodes is millions of long-lived objects, and each full
    collection walked them all: tens of ms in the middle of a filter call. Freezing them
    after the first sync keeps the collector to what changed since."""
    while not cache.synced() and not stop.is_set():
        await asyncio.sleep(0.2)
    gc.collect()
    gc.freeze()
    log.info("cache synced; %d objects frozen out of garbage collection", gc.get_freeze_count())


async def serve(cfg: ExtenderConfig, api: client.ApiClient, stop: threading.Event) -> None:
    cache = ClusterCache(resync_s=cfg.resync_s)
    cache.start(api, stop)
    view = PlacementView(cache, timedelta(seconds=cfg.stale_after_s))
    elector = None
    if cfg.leader_election:
        elector = LeaseElector(api, cfg.lease_namespace, cfg.lease_name, cfg.replica_identity())
        threading.Thread(target=elector.run, args=(stop,), name="leader", daemon=True).start()
    is_leader = elector.is_leader if elector else (lambda: True)
    barrier = BindBarrier(cfg.bind_wait_s)
    binder = Binder(client.CoreV1Api(api), view, cfg.default_policy, decided=barrier.decided)
    service = ExtenderService(view, binder, cfg.default_policy, is_leader, barrier=barrier)
    runner = web.AppRunner(service.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, ssl_context=tls_context(cfg))
    await site.start()
    log.info("extender listening on %s:%d", cfg.host, cfg.port)
    freezer = asyncio.create_task(freeze_when_synced(cache, stop))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        await asyncio.sleep(0.2)
    freezer.cancel()
    await runner.cleanup()
    log.info("extender stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="infergrid-scheduler-extender", description=__doc__)
    add_flags(parser, SETTINGS)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        cfg = load_settings(ExtenderConfig(), SETTINGS, args)
        tls_context(cfg)
        api = kube_api()
    except (ContractError, OSError, config.ConfigException) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    asyncio.run(serve(cfg, api, threading.Event()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
