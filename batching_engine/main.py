"""`infergrid-engine`: the inference server of one pod.

infergrid-engine [--config FILE] [--model URI] [--device auto|cpu|cuda] [--port 8000] ...

Settings come from the YAML file the operator mounts (its path in INFERGRID_ENGINE_CONFIG,
or --config), and flags override it; without a file, --model is required. The server
listens at once, so liveness passes while the model loads; readiness waits until the model is
loaded and has answered one warm-up request (server/warm_up.py). `--device auto`, the
default, serves on the GPU the pod was given and on the CPU when none is visible. SIGTERM
drains: readiness fails, everything accepted finishes, and the process exits 0.

Exit codes: 0 after a drain, 2 for bad settings (one line on stderr naming the field),
1 when the model fails to load for another reason.
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
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from batching_engine.config import CONFIG_ENV, TASKS, EngineConfig, ServingConfig
from batching_engine.device import AUTO, check_device
from batching_engine.metrics import EngineMetrics
from batching_engine.model_source import URI_FIELD, default_model_name, download_allowed, locate
from batching_engine.server.app import DEFAULT_MAX_BODY_BYTES, EngineServer, start_site
from infergrid.errors import ContractError
from infergrid.process import configure_logging
from infergrid.storage_uri import ALLOW_DOWNLOAD_ENV

log = logging.getLogger("infergrid.engine")
T = TypeVar("T")
EXIT_BAD_CONFIG = 2
EXIT_LOAD_FAILED = 1


def batch_sizes(text: str) -> tuple[int, ...]:
    """A comma-separated list of sizes, as argparse's type (its name is in its errors)."""
    return tuple(int(x) for x in text.split(",") if x.strip())


# EngineConfig attribute -> (flag, argparse type, help). The file's `engine` keys are the same
# settings in camelCase (config.py).
_ENGINE_FLAGS: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "max_num_seqs": ("--max-num-seqs", int, "sequences generated together"),
    "max_num_batched_tokens": ("--max-num-batched-tokens", int, "tokens per step"),
    "max_model_len": ("--max-model-len", int, "longest prompt + output, in tokens"),
    "block_size": ("--block-size", int, "tokens per KV-cache block (8, 16 or 32)"),
    "max_queue_size": ("--max-queue-size", int, "waiting requests before 429s"),
    "queue_timeout_s": ("--queue-timeout", float, "seconds a request may wait to start"),
    "priority_levels": ("--priority-levels", int, "request priority classes (0 first)"),
    "max_batch_size": ("--max-batch-size", int, "inputs per single-pass batch"),
    "preferred_batch_sizes": (
        "--preferred-batch-sizes",
        batch_sizes,
        "single-pass sizes sent at once, e.g. 4,8",
    ),
    "max_queue_delay_ms": ("--max-queue-delay-ms", int, "longest wait to fill a batch"),
}


@dataclass(frozen=True, slots=True)
class Settings:
    model_uri: str
    model_name: str
    task: str = "text-generation"
    engine: EngineConfig = EngineConfig()
    host: str = "0.0.0.0"
    port: int = 8000
    device: str = AUTO
    dtype: str | None = None
    kv_cache_memory: str | None = None
    gpu_memory_utilization: float | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    cpu_threads: int | None = None  # None: every usable CPU but one
    allow_download: bool = False


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="infergrid-engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help=f"serving YAML (default: ${CONFIG_ENV})")
    p.add_argument(
        "--model", help="pkg://NAME, file://PATH, pvc://CLAIM/PATH, hf://ORG/NAME[@REV] or a path"
    )
    p.add_argument(
        "--allow-download",
        action="store_true",
        default=None,
        help=f"fetch hf:// models missing from the cache (also ${ALLOW_DOWNLOAD_ENV}=true)",
    )
    p.add_argument("--model-name", help="the name clients send as `model`")
    p.add_argument("--task", choices=TASKS)
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument(
        "--device", help="auto (default: the GPU when one is visible), cpu, cuda, cuda:N"
    )
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--kv-cache-memory", help="KV-cache size on CPU (or a cap on GPU), e.g. 1GiB")
    p.add_argument("--gpu-memory-utilization", type=float, help="share of the GPU budget to use")
    p.add_argument("--max-body-bytes", type=int, help="largest request body")
    p.add_argument("--cpu-threads", type=int, help="torch CPU threads (default: CPUs - 1)")
    p.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    for attr, (flag, kind, text) in _ENGINE_FLAGS.items():
        p.add_argument(flag, dest=attr, type=kind, help=text)
    p.add_argument("--log-level", default="INFO")
    return p


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """Flags over the file over defaults; raises ContractError naming the field or flag."""
    path = args.config or environ.get(CONFIG_ENV)
    serving = ServingConfig.from_yaml_file(path) if path else None
    uri = args.model or (serving.model.storage_uri if serving else None)
    if not uri:
        raise ContractError(
            "--model", f"is required without a config file (--config or {CONFIG_ENV})"
        )
    download = args.allow_download or download_allowed(environ)
    locate(uri, "--model" if args.model else URI_FIELD, environ, download)
    given = {
        "model_name": args.model_name or (serving.model.name if serving else None),
        "task": args.task or (serving.model.task if serving else None),
        "host": args.host,
        "port": args.port or (serving.port if serving else None),
        "device": args.device,
        "dtype": args.dtype,
        "kv_cache_memory": args.kv_cache_memory,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "max_body_bytes": args.max_body_bytes,
        "cpu_threads": args.cpu_threads,
        "allow_download": download or None,
    }
    _check_port(given["port"])
    if given["device"] is not None:
        check_device(given["device"])
    _check_at_least_1(given, "max_body_bytes", "cpu_threads")
    engine = _engine_config(serving.engine if serving else EngineConfig(), args)
    values = {k: v for k, v in given.items() if v is not None}
    values.setdefault("model_name", default_model_name(uri))
    return Settings(model_uri=uri, engine=engine, **values)


def _engine_config(base: EngineConfig, args: argparse.Namespace) -> EngineConfig:
    overrides = {
        attr: getattr(args, attr) for attr in _ENGINE_FLAGS if getattr(args, attr) is not None
    }
    if args.prefix_caching is not None:
        overrides["enable_prefix_caching"] = args.prefix_caching
    try:
        return replace(base, **overrides)
    except ContractError as err:  # EngineConfig names the attribute; the user typed a flag
        flag = _ENGINE_FLAGS.get(err.field, ("--" + err.field.replace("_", "-"),))[0]
        raise ContractError(flag if err.field in overrides else err.field, err.reason) from None


def _check_port(port: int | None) -> None:
    if port is not None and not 1 <= port <= 65535:
        raise ContractError("--port", f"must be from 1 to 65535, got {port}")


def _check_at_least_1(given: dict[str, Any], *keys: str) -> None:
    for key in keys:
        if given[key] is not None and given[key] < 1:
            raise ContractError(
                "--" + key.replace("_", "-"), f"must be at least 1, got {given[key]}"
            )


# Serving.


async def serve(settings: Settings) -> int:
    """Listen, load, serve until SIGTERM or SIGINT, drain; the process's exit code."""
    from batching_engine.loading import load  # torch: imported once the flags are checked

    metrics = EngineMetrics()
    server = EngineServer(settings.engine, metrics, settings.max_body_bytes)
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
    loading = _in_daemon_thread(lambda: load(settings, metrics))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not loading.done():
        log.info("stopped while loading the model")
        return 0
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
