"""The gateway's HTTP face: the OpenAI API in front of every InferenceService.

A request goes through, in order: the key (401), the body (413, 408, 400 naming the field;
429 while the tenant's bodies in the gateway fill its share: body_budget.py), the model,
within the namespaces the key may call (404 listing the names it may use, 400 when a bare
name is served in several: model_names.py), the tenant's limits (429 with Retry-After; 400
for a request whose reservation of model tokens is more than the tenant's whole bucket:
admission.py), a hold while its service has no ready pod (the gateway asks for a replica of
a service at zero, at most maxScaleFromZero at once per tenant: wakes.py), the canary split,
the choice of a pod, and the forward, retried on another pod while the
client has seen nothing. Nothing reaches an engine that the gateway refused.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

import aiohttp
from aiohttp import web

from gateway.admission import NEVER, Admission
from gateway.balancer import Balancer, prefix_key
from gateway.body_budget import BodyBudget, BodyLease
from gateway.catalog import Backend, Key, Route
from gateway.config import GatewayConfig
from gateway.failed_keys import FailedKeys
from gateway.live_catalog import LiveCatalog
from gateway.loads import Loads, scrape
from gateway.metrics import GatewayMetrics
from gateway.model_names import MayCall, Unresolved, as_served, names, qualified, resolve
from gateway.openapi import DOCUMENT
from gateway.proxy import SHUT_DOWN, Answer, Retryable, UpstreamTimeout, forward, shut_down
from gateway.request_body import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    ParsedRequest,
    forwarded_body,
    parse_request,
    reservation,
)
from gateway.split import TrackSplit
from gateway.tenants import KeyTable, TenantLimits
from gateway.wakes import Wakes
from infergrid.capped_read import read_capped
from infergrid.engine_token import derive as derive_engine_token
from infergrid.errors import ContractError
from infergrid.openai_error import error_body
from infergrid.openapi import OPENAPI_PATH
from infergrid.openapi import handler as openapi_handler

log = logging.getLogger("infergrid.gateway")

MAX_ATTEMPTS = 3  # pods tried for one request before it is answered 503
SCALE_ASK_EVERY_S = 5.0  # a service at zero is asked for a replica at most this often
HOLD_POLL_S = 1.0  # a held request looks again at least this often
MODEL_SHOWN = 100  # characters of an unknown model's name echoed back
ANONYMOUS_WARNING = (
    "no API keys (allowAnonymous): every caller who reaches the gateway is the anonymous "
    "tenant, unauthenticated"
)
Scaler = Callable[[str, str], Awaitable[bool]]


class Refusal(Exception):
    """An answer the gateway gives itself; `reason` is its metrics label."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.reason, self.kind = status, reason, kind
        self.param, self.code, self.retry_after = param, code, retry_after

    def response(self) -> web.Response:
        body = error_body(str(self), self.kind, self.param, self.code)
        response = web.json_response(body, status=self.status)
        if self.retry_after is not None:
            response.headers["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        return response


@dataclass(slots=True)
class Served:
    """What one forwarded request came to, for the metrics."""

    track: str = ""
    status: int = 0


class Gateway:
    def __init__(
        self,
        cfg: GatewayConfig,
        live: LiveCatalog,
        metrics: GatewayMetrics | None = None,
        scaler: Scaler | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg, self.live, self.scaler, self.clock = cfg, live, scaler, clock
        self.metrics = metrics or GatewayMetrics()
        self.loads = Loads(cfg.failure_cooldown_s)
        self.balancer = Balancer(cfg.routing, cfg.affinity_slack)
        self.admission = Admission()
        self.bodies = BodyBudget(cfg.tenant_body_bytes)
        self.keys: KeyTable | None = None  # None with keys required: not loaded yet
        self.keys_required = cfg.secret is not None
        self.anonymous = cfg.anonymous
        self.wakes = Wakes()
        self.splits: dict[Key, TrackSplit] = {}
        self.held: dict[Key, int] = {}
        self.asked_at: dict[Key, float] = {}
        self.in_flight = 0
        self.draining = False
        self._admitted_tasks: set[asyncio.Task] = set()  # what `cut_off` ends
        self.session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task] = set()
        self.failed_keys = FailedKeys()
        self.timeouts = aiohttp.ClientTimeout(
            total=cfg.upstream_timeout_s, sock_connect=cfg.connect_timeout_s
        )

    # The application.

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.max_body_bytes)
        for path in (CHAT, COMPLETIONS, EMBEDDINGS):
            app.router.add_post(path, partial(self.handle, path))
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get(OPENAPI_PATH, openapi_handler(DOCUMENT))
        app.on_response_prepare.append(self._close_while_draining)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    def metrics_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.prometheus)
        return app

    async def _open(self, _app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        self._spawn(self._scrape_forever())

    async def _close(self, _app: web.Application) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self.session is not None:
            await self.session.close()

    async def _close_while_draining(
        self, _request: web.Request, response: web.StreamResponse
    ) -> None:
        """While draining, every answer closes its connection, so a client's next request
        opens a new one, which the Service sends to a replica still ready. (aiohttp has
        computed the headers by this hook, so the header is set here too.)"""
        if self.draining:
            response.force_close()
            response.headers["Connection"] = "close"

    def cut_off(self) -> list[asyncio.Task]:
        """Ends the admitted requests still in flight at the end of a drain, each with what
        its client can act on: a stream with an error event, a request whose answer has not
        begun with a 503 to retry. Returns their tasks, to wait for."""
        tasks = list(self._admitted_tasks)
        for task in tasks:
            task.cancel(SHUT_DOWN)
        return tasks

    def _spawn(self, coro: Awaitable[object]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # Probes and listings.

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, _request: web.Request) -> web.Response:
        """503 while not ready; ready or not, an open gateway says so (`warning`)."""
        problems = self.not_ready()
        body: dict[str, object] = {"ready": not problems, "waiting for": problems}
        if not self.keys_required:
            body["warning"] = ANONYMOUS_WARNING
        return web.json_response(body, status=503 if problems else 200)

    def not_ready(self) -> list[str]:
        problems = []
        if self.draining:
            problems.append("draining")
        if not self.live.synced:
            problems.append("the first list of InferenceServices and EndpointSlices")
        if self.keys_required and self.keys is None:
            problems.append(f"the API keys of Secret {self.cfg.api_keys_secret}")
        return problems

    async def prometheus(self, _request: web.Request) -> web.Response:
        body = self.metrics.exposition()
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    async def models(self, request: web.Request) -> web.Response:
        try:
            tenant = self.tenant(request)
        except Refusal as refusal:
            return refusal.response()
        data = [
            {"id": name, "object": "model", "created": 0,
             "owned_by": f"{route.namespace}/{route.service}"}
            for name, route in names(self.live.current, self._may_call(tenant)).items()
        ]  # fmt: skip
        return web.json_response({"object": "list", "data": data})

    # A request.

    async def handle(self, endpoint: str, request: web.Request) -> web.StreamResponse:
        arrived = self.clock()
        tenant = self.anonymous
        try:
            tenant = self.tenant(request)
        except Refusal as refusal:
            return self._refused(refusal, tenant)
        with self.bodies.lease(tenant.name) as lease:
            try:
                raw = await self._body(request, tenant, lease)
                parsed = self._parse(raw, endpoint)
                route = self._route(parsed.model, tenant)
                reserved = reservation(parsed, route.context_tokens, self.cfg.default_max_tokens)
                self._admit(tenant, reserved)
            except Refusal as refusal:
                return self._refused(refusal, tenant)
            raw = as_served(forwarded_body(raw, parsed), parsed.model, route)
            return await self._admitted(request, raw, parsed, route, tenant, arrived, reserved)

    def _refused(self, refusal: Refusal, tenant: TenantLimits) -> web.Response:
        self.metrics.refused.labels(refusal.reason, tenant.name).inc()
        return refusal.response()

    def _admit(self, tenant: TenantLimits, reserved: int) -> None:
        """Takes the request's reservation from the tenant's bucket, or refuses it: 429 with
        the wait, or 400 when no wait would do."""
        decision = self.admission.admit(tenant, reserved, self.clock())
        if decision.admitted:
            return
        if decision.reason == NEVER:
            raise Refusal(
                400, "token_capacity",
                f"max_tokens: the request may cost {reserved} model tokens (its prompt and "
                f"answers), more than tenant {tenant.name}'s whole bucket of "
                f"{tenant.tokens_per_minute:g} a minute, so it can never be admitted; ask for "
                "fewer max_tokens", param="max_tokens", code="tokens_over_capacity",
            )  # fmt: skip
        raise Refusal(
            429, "rate_limited",
            f"tenant {tenant.name} is over its {decision.reason} limit; retry after "
            f"{math.ceil(decision.retry_after_s)} s",
            kind="rate_limit_error", code=f"{decision.reason}_limit",
            retry_after=decision.retry_after_s,
        )  # fmt: skip

    async def _admitted(
        self, request: web.Request, raw: bytes, parsed: ParsedRequest, route: Route,
        tenant: TenantLimits, arrived: float, reserved: int,
    ) -> web.StreamResponse:  # fmt: skip
        """The admitted request served; its reservation is settled by the usage its answer
        reported, and kept whole when it reported none (a stream cut short, a timeout)."""
        served, used = Served(), None
        self.in_flight += 1
        self.metrics.in_flight.labels(route.model).inc()
        task = asyncio.current_task()
        self._admitted_tasks.add(task)
        try:
            answer = await self._serve(request, raw, parsed, route, arrived, served, tenant)
            used = answer.tokens_used
            return answer.response
        except Refusal as refusal:
            return self._refused(refusal, tenant)
        except asyncio.CancelledError as err:
            if not shut_down(err):
                raise
            task.uncancel()  # the cancel was the drain's, answered here
            served.track = ""
            return self._refused(Refusal(
                503, "shut_down", "the gateway replica shut down before the answer began; "
                "retry the request", kind="service_unavailable", code="gateway_shut_down",
                retry_after=1,
            ), tenant)  # fmt: skip
        finally:
            self._admitted_tasks.discard(task)
            self.in_flight -= 1
            self.metrics.in_flight.labels(route.model).dec()
            self.admission.settle(tenant, reserved, used, self.clock())
            if served.track:
                labels = (route.model, served.track, tenant.name)
                self.metrics.requests.labels(*labels, str(served.status)).inc()
                self.metrics.latency.labels(*labels).observe(self.clock() - arrived)

    def tenant(self, request: web.Request) -> TenantLimits:
        if not self.keys_required:
            return self.anonymous
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            message = "an API key is required: Authorization: Bearer <key>"
            raise self._unauthorized(request, message, "missing_api_key")
        limits = self.keys.tenant(key.strip()) if self.keys is not None else None
        if limits is None:
            raise self._unauthorized(request, "the API key is not valid", "invalid_api_key")
        return limits

    def _unauthorized(self, request: web.Request, message: str, code: str) -> Refusal:
        """A 401, or a 429 once the client's address has failed too often (failed_keys.py)."""
        wait = self.failed_keys.failed(request.remote or "", self.clock())
        if wait > 0:
            return Refusal(429, "auth_failures", "too many requests with a missing or invalid"
                           " API key from this address", kind="rate_limit_error",
                           code="auth_failures", retry_after=wait)  # fmt: skip
        return Refusal(401, "unauthorized", message, code=code)

    def _parse(self, raw: bytes, endpoint: str) -> ParsedRequest:
        try:
            return parse_request(raw, endpoint)
        except ContractError as err:
            raise Refusal(400, "bad_request", str(err), param=err.field) from None

    async def _body(self, request: web.Request, tenant: TenantLimits, lease: BodyLease) -> bytes:
        """The body, held against the tenant's budget as it arrives (body_budget.py)."""
        limit, declared = self.cfg.max_body_bytes, request.content_length
        if declared is not None and declared > limit:
            raise Refusal(413, "bad_request", f"body: over the {limit}-byte limit", param="body")
        if declared is not None and not lease.take(declared):
            raise self._over_body_budget(tenant)
        try:
            async with asyncio.timeout(self.cfg.read_timeout_s):
                raw = await read_capped(request.content, limit,
                                        None if declared is not None else lease.take)  # fmt: skip
        except TimeoutError:
            raise Refusal(
                408, "bad_request", "body: did not arrive in time", param="body"
            ) from None
        if raw is None and lease.refused:
            raise self._over_body_budget(tenant)
        if raw is None:
            raise Refusal(413, "bad_request", f"body: over the {limit}-byte limit", param="body")
        return raw

    def _over_body_budget(self, tenant: TenantLimits) -> Refusal:
        return Refusal(
            429, "body_bytes", f"body: tenant {tenant.name} already has "
            f"{self.cfg.tenant_body_bytes} bytes of request bodies in the gateway "
            "(tenantBodyBytes); retry once its requests in flight end", param="body",
            kind="rate_limit_error", code="body_bytes_limit", retry_after=1,
        )  # fmt: skip

    def _may_call(self, tenant: TenantLimits) -> MayCall:
        """The namespaces the tenant may call, among those the gateway serves."""
        served = self.cfg.namespaces
        return lambda namespace: tenant.may_call(namespace) and (not served or namespace in served)

    def _route(self, name: str, tenant: TenantLimits) -> Route:
        """The route the name reaches for this tenant (model_names.py). A namespace it may not
        call is as unknown as a missing one, so a tenant learns nothing of what it may not
        call, and no other tenant's model can take a name over."""
        try:
            return resolve(self.live.current, name, self._may_call(tenant))
        except Unresolved as err:
            shown = name if len(name) <= MODEL_SHOWN else f"{name[:MODEL_SHOWN]}..."
            if err.ambiguous:
                raise Refusal(400, "ambiguous_model", f"model {shown!r} is served in several "
                              f"namespaces you may call; name one: {', '.join(err.choices)}",
                              param="model", code="model_ambiguous") from None  # fmt: skip
            served = ", ".join(err.choices) or "none"
            raise Refusal(404, "unknown_model", f"model {shown!r} is not served; served: {served}",
                          param="model", code="model_not_found") from None  # fmt: skip

    async def _serve(
        self, request: web.Request, raw: bytes, parsed: ParsedRequest, route: Route,
        arrived: float, served: Served, tenant: TenantLimits,
    ) -> Answer:  # fmt: skip
        deadline = arrived + self.cfg.hold_timeout_s
        tried: set[Key] = set()
        while True:
            route = await self._ready(route, deadline, tenant)
            backend = self._choose(route, parsed, tried)
            if backend is None:
                message = f"every ready pod of {route.namespace}/{route.service} failed"
                raise Refusal(
                    503, "upstream_failed", message, kind="service_unavailable", retry_after=1
                )
            served.track = backend.track
            try:
                answer = await self._forward(request, raw, backend, route, parsed, arrived, tenant)
            except UpstreamTimeout as err:
                self.loads.failed(backend.key, self.clock())
                self.metrics.upstream_errors.labels(route.model, backend.track, "timeout").inc()
                log.warning("pod %s/%s gave no answer in time (%s); not retried",
                            backend.namespace, backend.pod, err)  # fmt: skip
                served.track = ""
                raise Refusal(504, "upstream_timeout",
                              f"no answer from the model within {self.cfg.upstream_timeout_s:g} s",
                              kind="timeout") from None  # fmt: skip
            except Retryable as err:
                tried.add(backend.key)
                self.loads.failed(backend.key, self.clock())
                self.metrics.upstream_errors.labels(route.model, backend.track, err.kind).inc()
                log.warning("pod %s/%s failed a request (%s); trying another", backend.namespace,
                            backend.pod, err)  # fmt: skip
                if len(tried) >= MAX_ATTEMPTS:
                    served.track = ""
                    raise Refusal(503, "upstream_failed", f"{len(tried)} engine pods failed",
                                  kind="service_unavailable", retry_after=1) from None  # fmt: skip
                continue
            served.status = answer.status
            if answer.cut_short:
                self.loads.failed(backend.key, self.clock())
                self.metrics.upstream_errors.labels(route.model, backend.track, "mid_stream").inc()
            return answer

    async def _forward(
        self, request: web.Request, raw: bytes, backend: Backend, route: Route,
        parsed: ParsedRequest, arrived: float, tenant: TenantLimits,
    ) -> Answer:  # fmt: skip
        labels = (route.model, backend.track, tenant.name)

        def first_byte() -> None:
            if parsed.stream:
                self.metrics.ttft.labels(*labels).observe(self.clock() - arrived)

        assert self.session is not None
        self.loads.started(backend.key)
        try:
            return await forward(self.session, backend, request, raw, self.timeouts, first_byte,
                                 self._engine_token(route),
                                 hide_usage=parsed.stream and not parsed.usage_asked)  # fmt: skip
        finally:
            self.loads.ended(backend.key)

    def _engine_token(self, route: Route) -> str:
        """The token the service's engines ask of callers; none without the key."""
        key = self.cfg.engine_token_key
        return derive_engine_token(key, route.namespace, route.service) if key else ""

    def _choose(self, route: Route, parsed: ParsedRequest, tried: set[Key]) -> Backend | None:
        """The canary split first, then the least-loaded pod of the track."""
        fresh = [b for b in route.backends if b.key not in tried]
        if not fresh:
            return None
        weights = {t: w for t, w in route.weights().items() if any(b.track == t for b in fresh)}
        weights = weights or {b.track: 1 for b in fresh}
        track = self.splits.setdefault(route.key, TrackSplit()).pick(weights)
        candidates = self.loads.usable([b for b in fresh if b.track == track], self.clock())
        prefix = None
        if self.cfg.prefix_chars and parsed.prefix_text:
            prefix = prefix_key(parsed.prefix_text, self.cfg.prefix_chars)
        return self.balancer.pick(candidates, self.loads.work, prefix)

    # Holding for a ready pod, and scale from zero.

    async def _ready(self, route: Route, deadline: float, tenant: TenantLimits) -> Route:
        """The route once it has a ready pod; held (bounded) until then. A service at zero
        replicas counts against the tenant's maxScaleFromZero while its request is held."""
        current = self._pinned(route)
        if current.backends:
            return current
        key = route.key
        if self.held.get(key, 0) >= self.cfg.hold_queue:
            raise Refusal(429, "hold_full", f"{self.cfg.hold_queue} requests already wait for a "
                          f"pod of {route.namespace}/{route.service}", kind="rate_limit_error",
                          retry_after=5)  # fmt: skip
        waking = current.replicas == 0
        if waking and not self.wakes.can_wake(tenant.name, key, tenant.max_scale_from_zero):
            raise Refusal(429, "scale_from_zero", f"tenant {tenant.name} already wakes "
                          f"{self.wakes.waking(tenant.name)} services from zero replicas, its "
                          "maxScaleFromZero; retry once one of them is ready",
                          kind="rate_limit_error", code="scale_from_zero_limit",
                          retry_after=5)  # fmt: skip
        self._hold(key, +1)
        if waking:
            self.wakes.wake(tenant.name, key)
        try:
            while not current.backends:
                self._maybe_scale_up(current)
                left = deadline - self.clock()
                if left <= 0:
                    raise Refusal(503, "hold_timeout", f"no pod of {route.namespace}/"
                                  f"{route.service} became ready within "
                                  f"{self.cfg.hold_timeout_s:g} s", kind="service_unavailable",
                                  retry_after=5)  # fmt: skip
                await self.live.changed(min(left, HOLD_POLL_S))
                current = self._pinned(route)
            return current
        finally:
            self._hold(key, -1)
            if waking:
                self.wakes.release(tenant.name, key)

    def _pinned(self, route: Route) -> Route:
        """The service the request resolved to, as the catalog has it now. Gone, or serving
        another model, it is a 404: a held request is never resolved again, so it cannot
        land in a namespace that took the name over meanwhile."""
        found = self.live.current.by_service.get(route.key)
        if found is None or found.model != route.model:
            raise Refusal(404, "unknown_model", f"model {qualified(route)!r} is no longer "
                          "served", param="model", code="model_not_found")  # fmt: skip
        return found

    def _hold(self, key: Key, step: int) -> None:
        count = self.held.get(key, 0) + step
        if count:
            self.held[key] = count
        else:
            self.held.pop(key, None)
        self.metrics.pending.labels(*key).set(count)

    def _maybe_scale_up(self, route: Route) -> None:
        if route.replicas > 0 or self.scaler is None or not self.cfg.scale_from_zero:
            return
        now = self.clock()
        if now - self.asked_at.get(route.key, -math.inf) < SCALE_ASK_EVERY_S:
            return
        self.asked_at[route.key] = now
        self._spawn(self._scale_up(route))

    async def _scale_up(self, route: Route) -> None:
        assert self.scaler is not None
        if await self.scaler(route.namespace, route.service):
            self.metrics.scale_ups.labels(route.namespace, route.service).inc()
            log.info("asked for a replica of %s/%s (at zero, %d held)", route.namespace,
                     route.service, self.held.get(route.key, 0))  # fmt: skip

    # Engine loads.

    async def _scrape_forever(self) -> None:
        while True:
            try:
                await self._scrape_once()
            except Exception:  # noqa: BLE001 - the loop must outlive any one round
                log.exception("reading the engines' queue depths failed")
            await asyncio.sleep(self.cfg.scrape_interval_s)

    async def _scrape_once(self) -> None:
        backends = [b for r in self.live.current.routes.values() for b in r.backends]
        self.loads.keep_only(b.key for b in backends)
        if backends and self.session is not None:
            await scrape(self.session, self.loads, backends, self.cfg.scrape_timeout_s)
