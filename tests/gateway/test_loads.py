"""A pod's work: the gateway's own requests live, plus what its engine holds for others."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from gateway.catalog import Backend
from gateway.loads import Loads, scrape
from infergrid.runtimes import RUNTIMES
from infergrid.tracks import STABLE

POD = ("ml", "chat-7d9f8b6c5-bbbbb")
OTHER = Backend("ml", "chat-7d9f8b6c5-ccccc", "http://10.0.0.2:8000", STABLE)
MINE = Backend("ml", POD[1], "http://10.0.0.1:8000", STABLE)


def test_the_gateways_own_requests_are_not_counted_twice_nor_after_they_ended():
    loads = Loads(cooldown_s=5)
    for _ in range(3):
        loads.started(POD)
    loads.reported(POD, held=3, ours=3)  # the engine's three are ours
    assert loads.work(POD) == 3
    for _ in range(3):
        loads.ended(POD)
    assert loads.work(POD) == 0  # not busy until the next scrape says so


def test_work_the_engine_holds_for_other_clients_counts():
    loads = Loads(cooldown_s=5)
    loads.started(POD)
    loads.reported(POD, held=5, ours=1)
    assert loads.work(POD) == 1 + 4


def test_a_failed_pod_cools_down_unless_all_have_failed():
    loads = Loads(cooldown_s=5)
    loads.failed(MINE.key, now=100)
    assert loads.usable([MINE, OTHER], now=101) == [OTHER]
    assert loads.usable([MINE], now=101) == [MINE]
    assert loads.usable([MINE, OTHER], now=105) == [MINE, OTHER]


def test_figures_of_pods_that_left_are_forgotten_but_in_flight_counts_stay():
    loads = Loads(cooldown_s=5)
    loads.started(POD)
    loads.reported(POD, held=4, ours=1)
    loads.keep_only([])
    assert loads.work(POD) == 1


def test_a_pods_load_is_read_in_its_runtimes_series():
    """A vLLM pod reports waiting and running requests as vllm:* gauges."""
    body = (
        '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="m"} 2\n'
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 3\n'
    )

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=body)

    async def run() -> Loads:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        backend = Backend("ml", POD[1], f"http://127.0.0.1:{port}", STABLE,
                          RUNTIMES["vllm"].metrics)  # fmt: skip
        loads = Loads(cooldown_s=1.0)
        try:
            async with aiohttp.ClientSession() as session:
                await scrape(session, loads, [backend], timeout_s=5.0)
        finally:
            await runner.cleanup()
        return loads

    assert asyncio.run(run()).foreign[("ml", POD[1])] == 5
