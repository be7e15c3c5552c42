"""The gateway's cost and its balancing, against real engine processes, in one run.

1. Added latency. The same small request (a chat completion, max_tokens 1, to a tiny random
   Llama) sent sequentially ``--requests`` times to one engine directly and through a gateway
   whose only pod is that engine, interleaved (direct, gateway, direct, ...) so that drift hits
   both paths alike, each over one kept-alive connection. Prints p50 and p99 of each path and
   the added p50 and p99 (gateway minus direct), in ms, beside the goal (added p99 <= 2 ms).
2. Least-loaded against round-robin at 80% load. Two engines behind one gateway; requests of
   mixed length (max_tokens drawn, by a fixed seed, from a Pareto distribution cut at
   ``--max-tokens-cap``, ignore_eos so each answer is exactly that long; each conversation
   new, so prefix affinity never binds). First the capacity: a closed loop at saturation
   through the gateway (requests/s), measured again at the end to show how far the machine
   drifted meanwhile. Then, for each policy, a gateway routing by it and the same open-loop
   Poisson schedule (same seed: same arrival times, same lengths) at ``--load`` of that
   capacity for ``--seconds`` in all. Both gateways run throughout, and the policies take
   turns in ``--rounds`` rounds (round r: schedule seed+r, least-loaded first in even rounds
   and last in odd ones), so that drift in the machine's speed hits both alike;
   ``--rounds 1`` is one schedule of ``--seconds`` each, least-loaded first. A
   request's latency runs from its scheduled arrival to the last byte of its answer, so a
   late send counts against the system, not for it. Prints per policy the offered rate, the
   achieved throughput, p50, p99, errors, how the requests split between the engines and
   each round's p99, then round-robin's p99 over least-loaded's.
3. The same with two engines of unequal capacity (batches ``--max-num-seqs`` and
   ``--unequal-batch``), as two pods on shares with different SM quotas are. On this
   machine's two cores the two engines of 2. are not independent servers (they, the gateway
   and the load generator share the cores), so the choice of pod matters little there; an
   engine that is slower by itself is where round-robin keeps sending its share regardless.

The gateway runs in a process of its own (``bench/gateway_server.py``: the real
``gateway.app.Gateway``, its catalog set once from flags), the engines are
``infergrid-engine`` processes (``harness/engine_process.py``) with ``--cpu-threads 1`` and a
small batch (``--max-num-seqs 4``, so that requests wait in the engines, where the choice of
pod matters), and the load comes from this process. Nothing is asserted: the figures are this
machine's, every process shares its cores, and a run prints what it saw. The header gives the
machine's own steadiness (the same pure-Python loop timed 20 times before anything starts):
on a shared virtual machine it swings, and at 80% load a slow spell becomes a queue. About 4
minutes with the defaults.

    .venv/bin/python -m bench.gateway [--requests 300] [--seconds 30] [--rounds 3]
        [--load 0.8] [--capacity-seconds 10] [--max-num-seqs 4] [--max-tokens-cap 256]
        [--seed 7] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from harness.engine_process import EngineProcess, requests_seen
from harness.tiny_model_dir import write_tiny_model

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SERVER = "bench.gateway_server"  # as a module: run as a file, this file would shadow `gateway`
MODEL = "tiny"
CHAT = "/v1/chat/completions"
POLICIES = ("least-loaded", "round-robin")
ADDED_P99_GOAL_MS = 2.0
PARETO_SCALE, PARETO_ALPHA = 4.0, 1.2  # max_tokens: median ~7, p99 ~190, cut at the cap
WARM_UP = 30  # requests per path before latency is measured
WARM_UP_S = 2.0  # seconds of load before capacity is measured


class GatewayServer:
    """``gateway_server.py`` in front of ``urls``, routing by ``routing``."""

    def __init__(self, urls: list[str], routing: str, log_path: Path) -> None:
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)}
        command = [sys.executable, "-m", SERVER, "--routing", routing]
        for url in urls:
            command += ["--backend", url]
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.stop()
            raise RuntimeError(f"the gateway did not start:\n{log_path.read_text()[-4000:]}")
        self.port = json.loads(line)["port"]
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_engines(tmp: Path, batches: list[int]) -> list[EngineProcess]:
    """As tests/gateway/engines.py starts them, one per batch size, each bounded so that
    queues form."""
    model = tmp / "tiny"
    if not model.exists():
        with quiet(tmp / "tiny-model.log"):
            write_tiny_model(model, max_positions=2048)
    args = ["--model", str(model), "--model-name", MODEL, "--kv-cache-memory", "32MiB",
            "--cpu-threads", "1"]  # fmt: skip
    engines = [
        EngineProcess([*args, "--max-num-seqs", str(batch)], tmp / f"engine-{i}-{batch}.log")
        for i, batch in enumerate(batches)
    ]
    try:
        for engine in engines:
            engine.wait_ready()
    except BaseException:
        for engine in engines:
            engine.kill()
        raise
    return engines


@contextlib.contextmanager
def quiet(log_path: Path) -> Iterator[None]:
    """File descriptors 1 and 2 into `log_path`: the tokenizer trainer (Rust) writes its
    progress there, not to sys.stdout or sys.stderr."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(log_path, "wb") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


def chat(content: str, max_tokens: int) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}  # fmt: skip


def pct(seconds: list[float]) -> dict[str, float]:
    """p50 and p99 in ms (p99: the sample below which 99% of the others lie)."""
    if not seconds:
        return {"p50_ms": float("nan"), "p99_ms": float("nan")}
    ms = sorted(s * 1000 for s in seconds)
    return {"p50_ms": round(statistics.median(ms), 3),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3)}  # fmt: skip


# 1. Added latency.


class Client:
    """One kept-alive HTTP/1.1 connection, posting one fixed body."""

    def __init__(self, port: int, body: dict) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.body = json.dumps(body).encode()
        self.headers = {"Content-Type": "application/json"}

    def post(self) -> tuple[float, int]:
        """Seconds from sending the request to its answer's last byte, and the status."""
        started = time.perf_counter()
        self.connection.request("POST", CHAT, self.body, self.headers)
        response = self.connection.getresponse()
        response.read()
        return time.perf_counter() - started, response.status

    def close(self) -> None:
        self.connection.close()


def added_latency(engine: EngineProcess, tmp: Path, requests: int) -> dict:
    body = chat("Say one word.", 1)
    gateway = GatewayServer([engine.url], "least-loaded", tmp / "gateway-latency.log")
    direct, through = Client(engine.port, body), Client(gateway.port, body)
    took: dict[str, list[float]] = {"direct": [], "gateway": []}
    errors = {"direct": 0, "gateway": 0}
    try:
        for _ in range(WARM_UP):
            direct.post()
            through.post()
        for _ in range(requests):
            for name, client in (("direct", direct), ("gateway", through)):
                seconds, status = client.post()
                if status == 200:
                    took[name].append(seconds)
                else:
                    errors[name] += 1
    finally:
        direct.close()
        through.close()
        gateway.stop()
    rows = {name: {**pct(took[name]), "errors": errors[name]} for name in took}
    added = {
        "p50_ms": round(rows["gateway"]["p50_ms"] - rows["direct"]["p50_ms"], 3),
        "p99_ms": round(rows["gateway"]["p99_ms"] - rows["direct"]["p99_ms"], 3),
    }
    return {"requests": requests, "paths": rows, "added": added,
            "goal_added_p99_ms": ADDED_P99_GOAL_MS}  # fmt: skip


# 2. Least-loaded against round-robin.


def max_tokens(rnd: random.Random, cap: int) -> int:
    return max(1, min(cap, round(PARETO_SCALE * rnd.paretovariate(PARETO_ALPHA))))


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float  # after the schedule's start
    max_tokens: int


def schedule(rate: float, seconds: float, seed: int, cap: int) -> list[Arrival]:
    """Poisson arrivals at `rate` per second for `seconds`, each with its answer's length."""
    rnd = random.Random(seed)
    arrivals, at = [], rnd.expovariate(rate)
    while at < seconds:
        arrivals.append(Arrival(at, max_tokens(rnd, cap)))
        at += rnd.expovariate(rate)
    return arrivals


async def post(http: aiohttp.ClientSession, url: str, body: dict) -> int | str:
    """The status, or the transport failure's name."""
    try:
        async with http.post(url + CHAT, json=body) as response:
            await response.read()
            return response.status
    except (aiohttp.ClientError, TimeoutError) as err:
        return type(err).__name__


def session() -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300))


async def capacity(url: str, workers: int, seconds: float, seed: int, cap: int) -> dict:
    """Requests/s that `workers` back-to-back clients get through at saturation: answers that
    end within `seconds`, after a warm-up of WARM_UP_S."""
    rnd = random.Random(seed + 1)
    counted, errors = 0, 0
    started = time.monotonic()
    window = (started + WARM_UP_S, started + WARM_UP_S + seconds)
    async with session() as http:

        async def worker(w: int) -> None:
            nonlocal counted, errors
            i = 0
            while time.monotonic() < window[1]:
                i += 1
                body = chat(f"Worker {w}, request {i}: tell me a story.", max_tokens(rnd, cap))
                status = await post(http, url, body)
                if not window[0] <= time.monotonic() <= window[1]:
                    continue
                if status == 200:
                    counted += 1
                else:
                    errors += 1

        await asyncio.gather(*(worker(w) for w in range(workers)))
    return {"workers": workers, "seconds": seconds,
            "requests_per_s": round(counted / seconds, 2), "errors": errors}  # fmt: skip


@dataclass(slots=True)
class Tally:
    """One policy's open-loop runs, pooled."""

    offered: int = 0
    seconds: float = 0.0  # scheduled
    span_s: float = 0.0  # from each run's start to its last answer, at least its schedule
    latencies: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    per_engine: list[int] = field(default_factory=list)
    p99_by_round: list[float] = field(default_factory=list)

    def row(self, policy: str) -> dict:
        return {"policy": policy, "requests": self.offered,
                "offered_per_s": round(self.offered / self.seconds, 2),
                "ok": len(self.latencies),
                "achieved_per_s": round(len(self.latencies) / self.span_s, 2),
                **pct(self.latencies), "errors": sum(self.failures.values()),
                "failures": dict(self.failures), "per_engine": self.per_engine,
                "p99_ms_by_round": self.p99_by_round}  # fmt: skip


async def open_loop(url: str, arrivals: list[Arrival], seconds: float, tally: Tally) -> None:
    """Sends each arrival at its time, whatever is in flight; waits for the stragglers up to
    `seconds` more. Latency is from the scheduled arrival to the answer's last byte."""
    latencies: list[float] = []
    last_done = 0.0
    async with session() as http:
        start = time.monotonic()

        async def one(i: int, arrival: Arrival) -> None:
            nonlocal last_done
            await asyncio.sleep(max(0.0, start + arrival.at_s - time.monotonic()))
            body = chat(f"Request {i}: tell me a story.", arrival.max_tokens)
            status = await post(http, url, body)
            done = time.monotonic()
            if status == 200:
                latencies.append(done - start - arrival.at_s)
                last_done = max(last_done, done)
            else:
                tally.failures[str(status)] += 1

        tasks = [asyncio.ensure_future(one(i, a)) for i, a in enumerate(arrivals)]
        _, pending = await asyncio.wait(tasks, timeout=seconds * 2)
        for task in pending:
            task.cancel()
        if pending:
            tally.failures["unfinished"] += len(pending)
            await asyncio.wait(pending)
    tally.offered += len(arrivals)
    tally.seconds += seconds
    tally.span_s += max(last_done - start, seconds)
    tally.latencies += latencies
    tally.p99_by_round.append(pct(latencies)["p99_ms"])


async def warm_up(url: str) -> None:
    """A few requests through a new gateway: its connections to the engines, kept alive."""
    async with session() as http:
        await asyncio.gather(*(post(http, url, chat(f"Warm-up {i}.", 8)) for i in range(8)))


async def requests_reached(urls: list[str]) -> list[float]:
    """Requests each engine has seen, however they ended, from its own /metrics."""
    counts = []
    async with aiohttp.ClientSession() as http:
        for url in urls:
            async with http.get(f"{url}/metrics") as response:
                counts.append(requests_seen(await response.text()))
    return counts


def balancing(engines: list[EngineProcess], tmp: Path, args: argparse.Namespace) -> dict:
    """Capacity through a least-loaded gateway, then both policies' gateways taking turns on
    the same schedules: round r is schedule seed+r, least-loaded first in even rounds, last in
    odd ones, so that drift in the machine's speed hits both alike."""
    urls = [e.url for e in engines]
    gateways = {policy: GatewayServer(urls, policy, tmp / f"gateway-{policy}.log")
                for policy in POLICIES}  # fmt: skip
    try:
        for gateway in gateways.values():
            asyncio.run(warm_up(gateway.url))
        workers = 2 * len(engines) * args.max_num_seqs
        cap = asyncio.run(capacity(gateways[POLICIES[0]].url, workers, args.capacity_seconds,
                                   args.seed, args.max_tokens_cap))  # fmt: skip
        rate = args.load * cap["requests_per_s"]
        seconds = args.seconds / args.rounds
        tallies = {policy: Tally(per_engine=[0] * len(urls)) for policy in POLICIES}
        lengths: list[int] = []
        for r in range(args.rounds):
            arrivals = schedule(rate, seconds, args.seed + r, args.max_tokens_cap)
            lengths += [a.max_tokens for a in arrivals]
            for policy in POLICIES if r % 2 == 0 else POLICIES[::-1]:
                before = asyncio.run(requests_reached(urls))
                asyncio.run(open_loop(gateways[policy].url, arrivals, seconds, tallies[policy]))
                after = asyncio.run(requests_reached(urls))
                split = tallies[policy].per_engine
                for i, (a, b) in enumerate(zip(after, before, strict=True)):
                    split[i] += round(a - b)
        cap_after = asyncio.run(capacity(gateways[POLICIES[0]].url, workers,
                                         args.capacity_seconds, args.seed,
                                         args.max_tokens_cap))  # fmt: skip
    finally:
        for gateway in gateways.values():
            gateway.stop()
    runs = [tallies[policy].row(policy) for policy in POLICIES]
    p99 = {r["policy"]: r["p99_ms"] for r in runs}
    lengths.sort()
    return {
        "capacity": cap,
        "capacity_after": cap_after,
        "load": args.load,
        "rate_per_s": round(rate, 2),
        "schedule": {
            "requests": len(lengths),
            "seconds": args.seconds,
            "rounds": args.rounds,
            "seed": args.seed,
            "max_tokens_p50": lengths[len(lengths) // 2] if lengths else 0,
            "max_tokens_p99": lengths[int(len(lengths) * 0.99)] if lengths else 0,
            "max_tokens_mean": round(statistics.mean(lengths), 1) if lengths else 0,
            "max_tokens_max": lengths[-1] if lengths else 0,
        },
        "policies": runs,
        "round_robin_p99_over_least_loaded": round(p99["round-robin"] / p99["least-loaded"], 3),
    }


# Output.


def machine() -> dict:
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor() or "unknown",
    )  # fmt: skip
    return {"cpu": model, "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "steadiness_ms": steadiness()}  # fmt: skip


def steadiness(tries: int = 20, steps: int = 500_000) -> dict[str, float]:
    """The same pure-Python loop timed `tries` times: min, median, max in ms."""
    took = []
    for _ in range(tries):
        started, total = time.perf_counter(), 0
        for i in range(steps):
            total += i
        took.append((time.perf_counter() - started) * 1000)
    return {"min": round(min(took), 1), "median": round(statistics.median(took), 1),
            "max": round(max(took), 1)}  # fmt: skip


def print_header(m: dict, args: argparse.Namespace) -> None:
    print(
        f"machine: {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable), "
        f"Python {m['python']}"
    )
    print(
        f"engines: 2 x infergrid-engine, tiny random Llama, --cpu-threads 1, "
        f"--max-num-seqs {args.max_num_seqs}, --kv-cache-memory 32MiB"
    )
    print(
        "gateway: bench/gateway_server.py (gateway.app.Gateway, default GatewayConfig but "
        "routing), its own process; load from this process; every process on these cores"
    )
    t = m["steadiness_ms"]
    print(
        f"steadiness: a fixed pure-Python loop took {t['min']:g} / {t['median']:g} / "
        f"{t['max']:g} ms (min / median / max of 20, before the engines started)"
    )
    print(f"settings: --requests {args.requests} --seconds {args.seconds:g} --rounds "
          f"{args.rounds} --load {args.load:g} --capacity-seconds {args.capacity_seconds:g} "
          f"--max-num-seqs {args.max_num_seqs} --max-tokens-cap {args.max_tokens_cap} "
          f"--seed {args.seed}")  # fmt: skip
    print(flush=True)


def print_latency(r: dict) -> None:
    print(
        f"1. added latency: chat completion, max_tokens 1, {r['requests']} sequential requests "
        "per path, interleaved"
    )
    print(f"{'path':>10} {'p50 ms':>9} {'p99 ms':>9} {'errors':>7}")
    for name, row in r["paths"].items():
        print(f"{name:>10} {row['p50_ms']:>9.3f} {row['p99_ms']:>9.3f} {row['errors']:>7}")
    added, goal = r["added"], r["goal_added_p99_ms"]
    verdict = "met" if added["p99_ms"] <= goal else "not met"
    print(
        f"{'added':>10} {added['p50_ms']:>9.3f} {added['p99_ms']:>9.3f}"
        f"   (goal: added p99 <= {goal:g} ms; {verdict})"
    )
    print(flush=True)


def print_balancing(r: dict, title: str) -> None:
    cap, s = r["capacity"], r["schedule"]
    print(f"{title}: least-loaded against round-robin at {r['load']:.0%} load")
    after = r["capacity_after"]
    print(
        f"capacity (closed loop through the gateway, least-loaded, {cap['workers']} workers, "
        f"{cap['seconds']:g} s): {cap['requests_per_s']:.2f} req/s, {cap['errors']} errors; "
        f"measured again after the rounds: {after['requests_per_s']:.2f} req/s"
    )
    print(
        f"schedule: Poisson at {r['rate_per_s']:.2f} req/s for {s['seconds']:g} s per policy, "
        f"in {s['rounds']} alternating rounds (seeds {s['seed']}..{s['seed'] + s['rounds'] - 1},"
        f" the same for both), {s['requests']} requests each"
    )
    print(
        f"max_tokens: p50 {s['max_tokens_p50']}, mean {s['max_tokens_mean']}, "
        f"p99 {s['max_tokens_p99']}, max {s['max_tokens_max']}; latency from scheduled arrival"
    )
    print(f"{'policy':>13} {'offered/s':>10} {'done/s':>8} {'p50 ms':>9} {'p99 ms':>9}"
          f" {'errors':>7}  {'per engine':>10}  p99 ms by round")  # fmt: skip
    for p in r["policies"]:
        split = "/".join(str(n) for n in p["per_engine"])
        rounds = " ".join(f"{ms:.0f}" for ms in p["p99_ms_by_round"])
        failures = f"  {p['failures']}" if p["failures"] else ""
        print(
            f"{p['policy']:>13} {p['offered_per_s']:>10.2f} {p['achieved_per_s']:>8.2f}"
            f" {p['p50_ms']:>9.1f} {p['p99_ms']:>9.1f} {p['errors']:>7}  {split:>10}  {rounds}"
            f"{failures}"
        )
    print(f"round-robin p99 / least-loaded p99: {r['round_robin_p99_over_least_loaded']:.3f}")
    print(flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=300, help="per path, for latency")
    parser.add_argument("--seconds", type=float, default=30.0, help="open loop, per policy")
    parser.add_argument("--load", type=float, default=0.8, help="fraction of the capacity")
    parser.add_argument("--rounds", type=int, default=3, help="turns per policy, alternating")
    parser.add_argument("--capacity-seconds", type=float, default=10.0)
    parser.add_argument("--max-num-seqs", type=int, default=4, help="each engine's batch")
    parser.add_argument("--unequal-batch", type=int, default=1,
                        help="the second engine's batch in the unequal pair")  # fmt: skip
    parser.add_argument("--max-tokens-cap", type=int, default=256)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    m = machine()
    if not args.json:
        print_header(m, args)
    pairs = {
        "equal": [args.max_num_seqs, args.max_num_seqs],
        "unequal": [args.max_num_seqs, args.unequal_batch],
    }
    balanced: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="infergrid-gateway-bench-") as where:
        tmp = Path(where)
        for n, (pair, batches) in enumerate(pairs.items(), 2):
            engines = start_engines(tmp, batches)
            try:
                if pair == "equal":
                    latency = added_latency(engines[0], tmp, args.requests)
                    if not args.json:
                        print_latency(latency)
                balanced[pair] = balancing(engines, tmp, args)
            finally:
                for engine in engines:
                    engine.kill()
            if not args.json:
                title = f"{n}. two engines, batches {batches[0]} and {batches[1]} ({pair})"
                print_balancing(balanced[pair], title)
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k != "json"}
        out = {"machine": m, "settings": settings, "added_latency": latency, "balancing": balanced}
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
