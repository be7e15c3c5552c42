"""`infergrid-engine`: the inference server of one pod.

infergrid-engine [--config FILE] [--model URI] [--device auto|cpu|cuda] [--port 8000] ...

Settings come from the YAML file the operator mounts (its path in INFERGRID_ENGINE_CONFIG,
or --config), and flags override it; without a file, --model is required. The server
listens at once, so liveness passes while the model loads; readiness waits until the model is
loaded and has answered one warm-up request (server/warm_up.py). `--device auto`, the
default, serves on the GPU the pod was given and on the CPU when none is visible. SIGTERM
drains: readiness fails, everything accepted finishes, and the process exits 0.
With INFERGRID_ENGINE_TOKEN_FILE set (the operator mounts the service's token), /v1/*
answers only requests carrying that token (server/caller_token.py).

Exit codes: 0 after a drain, 2 for bad settings (one line on stderr naming the field),
1 when the model fails to load for another reason, or when a tensor-parallel worker dies
(readiness fails at once; the engine drains what it can and exits).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from batching_engine.config import (
    ENGINE_FLAGS,
    PROCESS_SETTINGS,
    Settings,
    engine_config,
    file_settings,
    read_serving_file,
)
from batching_engine.metrics import EngineMetrics
from batching_engine.model_source import URI_FIELD, default_model_name, download_allowed, locate
from batching_engine.server.app import EngineServer, start_site
from batching_engine.server.caller_token import read_token
from infergrid.errors import ContractError
from infergrid.process import configure_logging
from infergrid.serving_config import CONFIG_ENV
from infergrid.settings import add_flags, flag_values

log = logging.getLogger("infergrid.engine")
T = TypeVar("T")
EXIT_BAD_CONFIG = 2
EXIT_LOAD_FAILED = 1


def parser() -> argparse.ArgumentParser:
    """`--config`, then one flag per setting of `batching_engine.config`'s tables."""
    p = argparse.ArgumentParser(
        prog="infergrid-engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_flags(p, PROCESS_SETTINGS + ENGINE_FLAGS, f"serving YAML (default: ${CONFIG_ENV})")
    p.add_argument("--log-level", default="INFO")
    return p


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """Flags over the file over defaults; raises ContractError naming the field or flag."""
    path = args.config or environ.get(CONFIG_ENV)
    served = read_serving_file(path) if path else None
    flags = flag_values(PROCESS_SETTINGS, args, name_flags=True)
    values = {**(file_settings(served) if served else {}), **flags}
    uri = values.get("model_uri")
    if not uri:
        raise ContractError(
            "--model", f"is required without a config file (--config or {CONFIG_ENV})"
        )
    download = bool(flags.get("allow_download")) or download_allowed(environ)
    locate(uri, "--model" if "model_uri" in flags else URI_FIELD, environ, download)
    values.setdefault("model_name", default_model_name(uri))
    values["allow_download"] = download
    values["caller_token"] = read_token(environ)
    engine = engine_config(
        served.engine if served else {}, flag_values(ENGINE_FLAGS, args, name_flags=True)
    )
    return Settings(engine=engine, **values)


# Serving.


async def serve(settings: Settings) -> int:
    """Listen, load, serve until SIGTERM or SIGINT, drain; the process's exit code."""
    from batching_engine.loading import load  # torch: imported once the flags are checked

    metrics = EngineMetrics()
    server = EngineServer(
        settings.engine,
        metrics,
        settings.max_body_bytes,
        settings.read_timeout_s,
        settings.caller_token,
    )
    try:
        site = await start_site(server, settings.host, settings.port)
    except OSError as err:  # the port is taken, or the host is not ours
        print(f"error: --port: cannot listen on {settings.host}:{settings.port}: {err.strerror}",
              file=sys.stderr)  # fmt: skip
        return EXIT_BAD_CONFIG
    log.info("listening on %s:%d; loading %s", settings.host, settings.port, settings.model_uri)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    code = await _load_then_serve(server, settings, load, stop, metrics)
    log.info("draining")
    await server.drain()
    await server.close()
    await site.cleanup()
    log.info("stopped")
    return code


async def _load_then_serve(server, settings, load, stop: asyncio.Event, metrics) -> int:
    loop = asyncio.get_running_loop()
    failures: list[str] = []

    def failed(reason: str) -> None:  # from the tensor-parallel monitor's thread
        failures.append(reason)
        loop.call_soon_threadsafe(stop.set)

    loading = _in_daemon_thread(lambda: load(settings, metrics, failed))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not loading.done():
        log.info("stopped while loading the model")
        return EXIT_LOAD_FAILED if failures else 0
    try:
        model, engine = loading.result()
    except ContractError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except Exception:
        log.exception("the model failed to load")
        return EXIT_LOAD_FAILED
    server.start(model, engine)
    try:
        seconds = await server.warm_up()
    except Exception:
        log.exception("the warm-up request failed; not turning ready")
        return EXIT_LOAD_FAILED
    log.info("ready: serving %s (%s); warm-up answered in %.2f s", model.name, model.task, seconds)
    await stopping
    if failures:
        log.error("%s; stopping", failures[0])
        return EXIT_LOAD_FAILED
    return 0


def _in_daemon_thread(fn: Callable[[], T]) -> asyncio.Future[T]:
    """`fn()` on a daemon thread, so a SIGTERM during a long load does not wait for it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            result = fn()
        except BaseException as err:  # handed to the event loop, which reports it
            loop.call_soon_threadsafe(_settle, future, None, err)
        else:
            loop.call_soon_threadsafe(_settle, future, result, None)

    threading.Thread(target=run, name="model-loader", daemon=True).start()
    return future


def _settle(future: asyncio.Future, result: Any, err: BaseException | None) -> None:
    if future.done():
        return
    if err is not None:
        future.set_exception(err)
    else:
        future.set_result(result)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging(args.log_level)
    try:
        settings = settings_from(args, os.environ)
    except (ContractError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    started = time.monotonic()
    code = asyncio.run(serve(settings))
    log.info("exit %d after %.0f s", code, time.monotonic() - started)
    return code


if __name__ == "__main__":
    sys.exit(main())
