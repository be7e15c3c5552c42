"""`infergrid-scheduler-extender`: the HTTP extender that infergrid-scheduler calls.

infergrid-scheduler-extender [--config FILE] [--port 8888] [--metrics-port 9464]
    [--no-leader-election]
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
from datetime import UTC, datetime, timedelta

from aiohttp import web
from kubernetes import client, config

from infergrid.errors import ContractError
from infergrid.process import configure_logging, kube_api
from infergrid.settings import add_flags, load_settings
from scheduler_extender.app import ExtenderService
from scheduler_extender.binder import Binder
from scheduler_extender.claim_preemption import pending_lister, preempt_for_claims
from scheduler_extender.config import SETTINGS, ExtenderConfig, check
from scheduler_extender.leader import LeaseElector
from scheduler_extender.pending_binds import BindBarrier
from scheduler_extender.preemptor import Preemptor, announcer, evictor
from scheduler_extender.scheduler_token import SERVICE_ACCOUNT_DIR, SchedulerToken
from scheduler_extender.tentative import Reserver
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


async def prepare_when_synced(view: PlacementView, stop: threading.Event) -> None:
    """Once the cache is synced, every node's placement state is built (``prepare``), before
    the extender says it is ready: at 5,000 nodes the first filter would spend 2 s on it.
    Then the cache and the states, millions of long-lived objects, are frozen out of garbage
    collection: each full collection walked them all, tens of ms in the middle of a call;
    frozen, the collector keeps to what changed since."""
    while not view.cache.synced() and not stop.is_set():
        await asyncio.sleep(0.2)
    if stop.is_set():
        return
    nodes = view.prepare(datetime.now(UTC))
    gc.collect()
    gc.freeze()
    log.info(
        "cache synced; %d nodes' placement states built, %d objects frozen out of garbage"
        " collection",
        nodes,
        gc.get_freeze_count(),
    )


def scheduler_token(cfg: ExtenderConfig, api: client.ApiClient) -> SchedulerToken | None:
    """The minter of kube-scheduler's token, in this pod's namespace; None when it is off."""
    if cfg.scheduler_token_dir is None:
        return None
    namespace = (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip()
    return SchedulerToken(
        client.CoreV1Api(api), cfg.scheduler_service_account, namespace, cfg.scheduler_token_dir
    )


async def listen(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
    return runner


async def serve(
    cfg: ExtenderConfig,
    api: client.ApiClient,
    stop: threading.Event,
    token: SchedulerToken | None = None,
) -> None:
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
    reserver = None
    if cfg.tentative_reservation_s > 0:
        reserver = Reserver(view, cfg.default_policy, cfg.tentative_reservation_s)
    preemptor = None
    if cfg.preemption_hold_s > 0:
        core = client.CoreV1Api(api)
        preemptor = Preemptor(
            view, cfg.default_policy, evictor(core), announcer(core), cfg.preemption_hold_s,
            preemptible=cfg.preemptible(),
        )  # fmt: skip
    service = ExtenderService(
        view, binder, cfg.default_policy, is_leader, barrier=barrier, reserver=reserver,
        preemptor=preemptor, preemptible=cfg.preemptible(),
    )  # fmt: skip
    runners = [await listen(service.app(), cfg.host, cfg.port, tls_context(cfg))]
    log.info("extender listening on %s:%d", cfg.host, cfg.port)
    if cfg.metrics_port:
        runners.append(await listen(service.metrics_app(), cfg.metrics_address, cfg.metrics_port))
        log.info("metrics on %s:%d", cfg.metrics_address, cfg.metrics_port)
    tasks = [asyncio.create_task(prepare_when_synced(view, stop))]
    if preemptor is not None:
        tasks.append(asyncio.create_task(preempt_for_claims(
            pending_lister(client.CoreV1Api(api)), preemptor, lambda: sorted(cache.dra_nodes()),
            lambda: datetime.now(UTC), is_leader, stop,
        )))  # fmt: skip
    if token is not None:
        tasks.append(asyncio.create_task(token.run()))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        await asyncio.sleep(0.2)
    for task in tasks:
        task.cancel()
    for runner in runners:
        await runner.cleanup()
    log.info("extender stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="infergrid-scheduler-extender", description=__doc__)
    add_flags(parser, SETTINGS)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        cfg = check(load_settings(ExtenderConfig(), SETTINGS, args))
        tls_context(cfg)
        api = kube_api()
        token = scheduler_token(cfg, api)
    except (ContractError, OSError, config.ConfigException) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    asyncio.run(serve(cfg, api, threading.Event(), token))
    return 0


if __name__ == "__main__":
    sys.exit(main())
