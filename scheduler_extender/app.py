"""The extender's HTTP service (aiohttp): /filter, /prioritize, /bind, health and metrics.

Two apps, on two listeners: `app` (the verbs, /healthz, /readyz and /openapi.json) for
kube-scheduler on loopback, and `metrics_app` (/metrics and /healthz) for Prometheus; neither
serves the other's paths, so exposing /metrics never exposes the unauthenticated verbs.

Handlers only decode, ask `decisions` or the `Binder`, and encode. Bad input
gets a 400 (or 413 past the body limit) with an `Error` naming the field,
never a 500: an unexpected exception is logged and answered in `Error`.
A burst is placed on a cache that holds the pods before it: prioritize holds each pod's
placement on the node it ranks first (`tentative`, on by default), or, where that is off, a
filter first waits for the binds of pods that passed filter before it (`pending_binds`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from infergrid.errors import ContractError
from infergrid.openapi import OPENAPI_PATH, handler
from scheduler_extender import metrics
from scheduler_extender.binder import Binder, BindError
from scheduler_extender.config import DEFAULT_PREEMPTIBLE
from scheduler_extender.decisions import filter_nodes, preempt_nodes, prioritize_nodes
from scheduler_extender.openapi import DOCUMENT
from scheduler_extender.pending_binds import BindBarrier
from scheduler_extender.preemptor import Preemptor
from scheduler_extender.protocol import (
    ERROR,
    binding_result,
    decode_binding_args,
    decode_extender_args,
    decode_preemption_args,
    encode,
    filter_result,
    preemption_result,
    priority_list,
)
from scheduler_extender.tentative import Reserver, predicted_node, sole_top
from scheduler_extender.view import PlacementView

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024
"""Thousands of node names fit easily; a larger body is refused with 413."""


def pod_uid(pod: dict[str, Any]) -> str:
    """The pod's uid, which bind names it by; namespace/name if a caller sent none."""
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


def _reply(doc: dict[str, Any] | list[dict[str, Any]], status: int = 200) -> web.Response:
    """The JSON answer, with the headers aiohttp's json_response would send."""
    return web.Response(
        body=encode(doc), status=status, content_type="application/json", charset="utf-8"
    )


async def _run_steps(steps: Iterator[None]) -> None:
    """Runs each step, letting the event loop serve what arrived before the next. A failure
    is logged and leaves the workload pending: the next request starts the steps again."""
    try:
        for _ in steps:
            await asyncio.sleep(0)
    except Exception:  # noqa: BLE001 - the verbs go on under the workload in use
        log.exception("adopting the re-read workload failed")


class ExtenderService:
    def __init__(
        self,
        view: PlacementView,
        binder: Binder,
        default_policy: str,
        is_leader: Callable[[], bool],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        barrier: BindBarrier | None = None,
        reserver: Reserver | None = None,
        preemptor: Preemptor | None = None,
        preemptible: frozenset[str] = DEFAULT_PREEMPTIBLE,
    ):
        self.view = view
        self.binder = binder
        self.default_policy = default_policy
        self.is_leader = is_leader
        self.clock = clock
        self.barrier = barrier or BindBarrier(wait_s=0)
        self.reserver = reserver
        self.preemptor = preemptor
        self.preemptible = preemptible
        self._tasks: set[asyncio.Task[None]] = set()
        self._adopting: asyncio.Task[None] | None = None

    def app(self) -> web.Application:
        """kube-scheduler's: the verbs, and the probes."""
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/filter", self._timed("filter", self.filter))
        app.router.add_post("/prioritize", self._timed("prioritize", self.prioritize))
        app.router.add_post("/bind", self._timed("bind", self.bind))
        app.router.add_post("/preempt", self._timed("preempt", self.preempt))
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get(OPENAPI_PATH, handler(DOCUMENT))
        return app

    def metrics_app(self) -> web.Application:
        """Prometheus's: /metrics, and /healthz for a probe of this listener."""
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
        return app

    def _timed(self, verb: str, handler: Callable[[web.Request], Awaitable[web.Response]]):
        async def run(request: web.Request) -> web.Response:
            started = time.perf_counter()
            try:
                return await handler(request)
            except web.HTTPException:
                raise
            except ContractError as err:
                return _reply({ERROR: str(err)}, status=400)
            except Exception as err:  # noqa: BLE001 - the scheduler gets an answer, not a 500
                log.exception("%s failed", verb)
                return _reply({ERROR: f"internal error: {err}"}, status=200)
            finally:
                metrics.REQUEST_SECONDS.labels(verb).observe(time.perf_counter() - started)

        return run

    async def filter(self, request: web.Request) -> web.Response:
        args = decode_extender_args(await request.read())
        uid = pod_uid(args.pod)
        waited, ran_out = await self.barrier.wait_for_others(uid)
        metrics.BIND_WAIT_SECONDS.observe(waited)
        if ran_out:
            metrics.BIND_WAIT_RAN_OUT.inc()
        self._new_cycle(uid)
        out = filter_nodes(args.pod, args.node_names, self.view, self.default_policy, self.clock())
        for category, count in Counter(out.categories).items():
            metrics.REJECTIONS.labels(category).inc(count)
        if out.passed:
            self.barrier.passed_filter(uid, args.pod)
        if len(out.passed) == 1:  # kube-scheduler binds a lone node without asking prioritize
            self._hold_next(args.pod, uid, out.passed[0])
        if not out.passed and out.failed and self.preemptor is not None and self.is_leader():
            plan = self.preemptor.plan(args.pod, list(out.failed), self.clock())
            if plan is not None and plan.evict:
                self._in_background(self.preemptor.evict_all(args.pod, plan))
        self._adopt_soon()
        return _reply(filter_result(out.passed, out.failed, out.unresolvable))

    async def prioritize(self, request: web.Request) -> web.Response:
        args = decode_extender_args(await request.read())
        uid = pod_uid(args.pod)
        self._new_cycle(uid)
        scores = prioritize_nodes(
            args.pod, args.node_names, self.view, self.default_policy, self.clock()
        )
        if self.reserver is not None:
            chosen, tied = predicted_node(scores)
            if chosen is not None:
                scores = sole_top(scores, tied)
                self._hold_next(args.pod, uid, chosen)
        self._adopt_soon()
        return _reply(priority_list(scores))

    def _new_cycle(self, uid: str) -> None:
        """Before the pod is weighed again: holds past their time go, and so does its own."""
        if self.reserver is not None:
            self.reserver.expire()
            self.reserver.forget(uid)
        elif self.preemptor is not None:
            self.preemptor.new_cycle(uid)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Runs `work` after the answer is sent, keeping the task referenced until it ends."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _adopt_soon(self) -> None:
        """Starts adopting a pending learned workload (``PlacementView.adoption``) unless
        that is under way: one step per turn of the event loop, between requests."""
        if self._adopting is not None and not self._adopting.done():
            return
        steps = self.view.adoption()
        if steps is not None:
            self._adopting = asyncio.get_running_loop().create_task(_run_steps(steps))

    def _hold_next(self, pod: dict[str, Any], uid: str, node: str) -> None:
        """Holds the pod's placement on `node` as the event loop's next step, right after the
        answer is sent: off kube-scheduler's wait for the answer, yet before the loop reads
        another request (callbacks already queued run before those of new input)."""
        if self.reserver is not None:
            asyncio.get_running_loop().call_soon(self.reserver.hold, pod, uid, node)

    async def preempt(self, request: web.Request) -> web.Response:
        args = decode_preemption_args(await request.read())
        kept = preempt_nodes(
            args.pod, args.nodes, self.view, self.default_policy, self.clock(), self.preemptible
        )
        metrics.PREEMPTION_NODES.labels("kept").inc(len(kept))
        metrics.PREEMPTION_NODES.labels("dropped").inc(len(args.nodes) - len(kept))
        return _reply(preemption_result(kept))

    async def bind(self, request: web.Request) -> web.Response:
        args = decode_binding_args(await request.read())
        if not self.is_leader():
            self.barrier.decided(args.pod_uid)
            metrics.BIND_FAILURES.labels("not-leader").inc()
            return _reply(binding_result("this extender replica is not the leader"))
        try:
            policy = await self.binder.bind(args, self.barrier.pending.filtered_pod(args.pod_uid))
        except BindError as err:
            metrics.BIND_FAILURES.labels(err.cause).inc()
            log.info("bind of %s/%s refused: %s", args.pod_namespace, args.pod_name, err)
            return _reply(binding_result(str(err)))
        metrics.PLACEMENTS.labels(policy).inc()
        return _reply(binding_result())

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, request: web.Request) -> web.Response:
        """Ready once the cache is synced and every node's state built, and only while this
        replica leads: only the leader gets traffic."""
        ready = self.view.cache.synced() and self.view.prepared and self.is_leader()
        return web.Response(text="ok\n" if ready else "not ready\n", status=200 if ready else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        if self.reserver is not None:
            self.reserver.expire()
        for kind, count in self.view.cache.size().items():
            metrics.CACHE_OBJECTS.labels(kind).set(count)
        metrics.LEADER.set(1 if self.is_leader() else 0)
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})
