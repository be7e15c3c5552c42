"""The gateway's memory under hostile load: 32 requests in flight at once, from one tenant.

Four kinds, eight of each, all started together:

- bodies at the limit: `maxBodyBytes` of valid JSON, just under the count of values the
  gateway parses (request_body.PARSED_VALUES), the costliest document it will parse;
- deeply nested JSON: `maxBodyBytes` of `[`, refused before parsing;
- slow senders: chunked bodies that send 1 MiB, then nothing until the run ends;
- huge answers: small requests that a fake engine answers with a 200 MiB JSON body, which
  the client reads to the end.

The gateway is `bench/gateway_server.py` (the real `gateway.app.Gateway`, default
`GatewayConfig`, its one anonymous tenant) in a process of its own; the fake engine and the
clients run in this one. The figure is the gateway's peak resident memory (VmHWM) less its
resident memory once warm (VmRSS after one small request), beside `bound_mib`, which
derives the most it may be from the settings. `tests/gateway/test_gateway_memory.py` asserts
the same run stays under the bound.

Then what dominates a parse: for bodies of `maxBodyBytes` made of one JSON value repeated,
each in a fresh process, the peak memory of orjson parsing it whole (what the gateway did
before it counted values) and of the gateway's `parse_request`, for the same shape as many
times as it parses (request_body.PARSED_VALUES) and text after. About 30 s in all.

    .venv/bin/python -m bench.gateway_memory [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

from bench.gateway import GatewayServer
from gateway.config import GatewayConfig, MiB
from gateway.proxy import HELD_ANSWER_BYTES
from gateway.request_body import PARSED_VALUES, parse_request
from harness.engine_process import free_port

EACH = 8  # requests of each kind
HUGE_ANSWER = 200 * MiB
HUGE_HEAD, HUGE_END = b'{"choices":[{"message":{"content":"', b'"}}],"usage":{"total_tokens":9}}'
PARSE_PEAK = 48 * MiB  # one parse at PARSED_VALUES, measured at 40 MiB (request_body.py)
RELAY_BYTES = 4 * HELD_ANSWER_BYTES  # the held head, its copy, and the read buffers
SLACK = 32 * MiB  # the allocator's and aiohttp's own, per run
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def bound_mib(cfg: GatewayConfig, huge_answers: int = EACH) -> float:
    """The most the gateway's memory may grow by under this load: the tenant's bodies
    (tenantBodyBytes) and one more being copied out of its read buffer; one parse at a time
    (parsing runs on the event loop, so parses never overlap); each relayed answer's head
    and buffers; and slack."""
    bodies = cfg.tenant_body_bytes + cfg.max_body_bytes
    return (bodies + PARSE_PEAK + huge_answers * RELAY_BYTES + SLACK) / MiB


@dataclass(frozen=True, slots=True)
class Figures:
    warm_rss_mib: float
    peak_rss_mib: float
    growth_mib: float
    bound_mib: float
    statuses: dict[str, dict[str, int]]  # kind -> status -> count
    huge_bytes_received: list[int]


SHAPES = {"{}": b"{},", "[]": b"[],", "1.5": b"1.5,", '"ab"': b'"ab",',
          "message": b'{"role":"user","content":"hi"},'}  # fmt: skip


def shaped_body(item: bytes, limit: int, count: int) -> bytes:
    """A chat of `limit` bytes: `count` times `item` in its messages, then text."""
    head, tail = b'{"model":"tiny","messages":[', b'{"role":"user","content":"'
    fill = max(0, limit - len(head) - count * len(item) - len(tail) - 4)
    return (head + item * count + tail + b"x" * fill + b'"}]}')[:limit]


def body_at_limit(limit: int) -> bytes:
    """`limit` bytes of a chat whose messages hold as many values as the gateway parses."""
    return shaped_body(SHAPES["message"], limit, PARSED_VALUES // 3 - 16)  # a `{`, two `,`


async def fake_engine() -> tuple[web.AppRunner, str]:
    """An engine that answers `user: huge` with HUGE_ANSWER bytes of JSON, else briefly."""
    chunk = b"x" * MiB

    async def answer(request: web.Request) -> web.StreamResponse:
        doc = orjson.loads(await request.read())
        if doc.get("user") != "huge":
            return web.json_response({"choices": [], "usage": {"total_tokens": 1}})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(HUGE_HEAD)
        for _ in range(HUGE_ANSWER // MiB):
            await response.write(chunk)
        await response.write(HUGE_END)
        await response.write_eof()
        return response

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/v1/chat/completions", answer)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def parse_peak_mib(shape: str, capped: bool) -> float:
    """Peak memory of one parse, in a fresh process (this module's `--parse`)."""
    argv = [sys.executable, "-m", "bench.gateway_memory", "--parse", shape]
    root = Path(__file__).resolve().parent.parent
    argv += ["--capped"] if capped else []
    done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=root)
    return float(done.stdout)


def parse_once(shape: str, capped: bool) -> None:
    """Prints the growth of this process's peak memory over one parse of the shape."""
    item, limit = SHAPES[shape], GatewayConfig().max_body_bytes
    counted = sum(item.count(c) for c in (b",", b"[", b"{"))
    count = PARSED_VALUES // counted - 16 if capped else (limit - 64) // len(item)
    raw = shaped_body(item, limit, count)
    before = memory_mib(os.getpid(), "VmHWM")
    if capped:
        parse_request(raw, "/v1/chat/completions")
    else:
        orjson.loads(raw)
    print(memory_mib(os.getpid(), "VmHWM") - before)


def memory_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


async def post(http: aiohttp.ClientSession, url: str, data: object) -> tuple[int, int]:
    headers = {"Content-Type": "application/json"}
    async with http.post(f"{url}/v1/chat/completions", data=data, headers=headers) as resp:
        size = 0
        async for chunk in resp.content.iter_any():
            size += len(chunk)
        return resp.status, size


async def slow_sender(
    http: aiohttp.ClientSession, url: str, stop: asyncio.Event
) -> tuple[int, int]:
    async def trickle():
        yield b'{"model":"tiny","messages":[{"role":"user","content":"' + b"x" * MiB
        await stop.wait()
        yield b'"}]}'

    return await post(http, url, trickle())


async def attack(url: str, limit: int) -> tuple[dict[str, dict[str, int]], list[int]]:
    stop = asyncio.Event()
    at_limit, nested = body_at_limit(limit), b"[" * limit
    huge = orjson.dumps({**CHAT, "user": "huge"})
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        kinds = {
            "body at the limit": [post(http, url, at_limit) for _ in range(EACH)],
            "deeply nested": [post(http, url, nested) for _ in range(EACH)],
            "huge answer": [post(http, url, huge) for _ in range(EACH)],
        }
        slow = [asyncio.ensure_future(slow_sender(http, url, stop)) for _ in range(EACH)]
        done = {k: await asyncio.gather(*calls) for k, calls in kinds.items()}
        stop.set()
        done["slow sender"] = await asyncio.gather(*slow)
    statuses = {k: dict(Counter(str(s) for s, _ in v)) for k, v in done.items()}
    return statuses, [size for _, size in done["huge answer"]]


async def run(log: Path) -> Figures:
    runner, engine = await fake_engine()
    server = GatewayServer([engine], "least-loaded", log)
    cfg = GatewayConfig()
    try:
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            await post(http, server.url, orjson.dumps(CHAT))  # warm: imports, first connection
        warm = memory_mib(server.process.pid, "VmRSS")
        statuses, huge = await attack(server.url, cfg.max_body_bytes)
        peak = memory_mib(server.process.pid, "VmHWM")
    finally:
        server.stop()
        await runner.cleanup()
    return Figures(warm, peak, peak - warm, bound_mib(cfg), statuses, huge)


def measure() -> Figures:
    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(run(Path(tmp) / "gateway.log"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--parse", choices=SHAPES, help=argparse.SUPPRESS)
    parser.add_argument("--capped", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.parse:
        parse_once(args.parse, args.capped)
        return 0
    figures = measure()
    peaks = {s: (parse_peak_mib(s, False), parse_peak_mib(s, True)) for s in SHAPES}
    if args.json:
        print(json.dumps({**asdict(figures), "parse_peaks_mib": peaks}, indent=2))
        return 0
    print(f"{EACH} requests of each kind in flight at once, one tenant, default GatewayConfig")
    print(f"{'kind':<20} statuses")
    for kind, statuses in figures.statuses.items():
        print(f"{kind:<20} {', '.join(f'{n} x {s}' for s, n in sorted(statuses.items()))}")
    received = sorted({b // MiB for b in figures.huge_bytes_received})
    print(f"huge answers received whole: {received} MiB each")
    print(f"{'gateway RSS warm':<28}{figures.warm_rss_mib:>8.0f} MiB")
    print(f"{'gateway peak RSS (VmHWM)':<28}{figures.peak_rss_mib:>8.0f} MiB")
    print(f"{'growth':<28}{figures.growth_mib:>8.0f} MiB")
    print(f"{'bound from the settings':<28}{figures.bound_mib:>8.0f} MiB")
    limit = GatewayConfig().max_body_bytes // MiB
    print(f"\npeak memory of one parse of {limit} MiB of a value repeated")
    print(f"{'value':<12}{'orjson, whole':>16}{'gateway, at the cap':>22}")
    for shape, (whole, capped) in peaks.items():
        print(f"{shape:<12}{whole:>12.0f} MiB{capped:>18.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
