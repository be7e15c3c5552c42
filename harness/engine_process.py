"""`infergrid-engine` as a real process, and an overload client to throw at it.

Used by test_drain and test_overload, by bench/engine_overload.py, which runs the same
overload for longer and prints what it saw, and by bench/embeddings_throughput.py.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


def requests_seen(metrics_text: str) -> float:
    """Requests that reached an engine, however they ended (its requests_total, every
    status), from the text of its /metrics: what tests and benchmarks count an engine's share
    of traffic by, independent of whoever sent it."""
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "infergrid_engine_requests":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_command() -> list[str]:
    """The installed console script next to this Python, else the module."""
    script = Path(sys.executable).with_name("infergrid-engine")
    if script.exists():
        return [str(script)]
    found = shutil.which("infergrid-engine")
    return [found] if found else [sys.executable, "-m", "batching_engine.main"]


class EngineProcess:
    """One engine process on a free port; stdout and stderr go to a log file."""

    def __init__(
        self, args: list[str], log_path: Path, extra_env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = os.environ | {"PYTHONUNBUFFERED": "1"} | (extra_env or {})
        env.pop("INFERGRID_ENGINE_CONFIG", None)
        command = [*engine_command(), "--host", "127.0.0.1", "--port", str(self.port), *args]
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, limit_s: float = 300.0) -> None:
        """Poll /readyz until 200; fails with the process's log if it exits first."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited {self.proc.returncode}:\n{self.log()}")
            if asyncio.run(readiness(self.url)) == 200:
                return
            time.sleep(0.2)
        raise RuntimeError(f"engine not ready after {limit_s:.0f} s:\n{self.log()}")

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, limit_s: float = 120.0) -> int:
        return self.proc.wait(timeout=limit_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def rss_kib(self) -> tuple[int, int]:
        """(resident set now, its peak so far), in KiB, from /proc."""
        fields = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


async def readiness(url: str) -> int | None:
    """/readyz's status, or None when nothing answers."""
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/readyz", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                return resp.status
    except aiohttp.ClientError:
        return None


async def overload(
    url: str, clients: int, seconds: float, body: dict, retry_pause_s: float = 0.0
) -> Counter[str]:
    """`clients` loops posting `body` to /v1/completions for `seconds`, each retrying after
    `retry_pause_s` when refused (ignoring Retry-After keeps the pressure on). Counts HTTP
    statuses, and transport failures by exception name."""
    statuses: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def client() -> None:
            while time.monotonic() < deadline:
                try:
                    async with http.post(url + "/v1/completions", json=body) as resp:
                        await resp.read()
                        statuses[str(resp.status)] += 1
                    if resp.status == 429 and retry_pause_s:
                        await asyncio.sleep(retry_pause_s)
                except aiohttp.ClientError as err:
                    statuses[type(err).__name__] += 1
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(client() for _ in range(clients)))
    return statuses
