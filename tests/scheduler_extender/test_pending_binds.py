"""kube-scheduler binds asynchronously; a filter waits for the binds of pods that passed filter
before it, so a burst of pods is placed on a cache that holds the earlier ones."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client.rest import ApiException
from prometheus_client import REGISTRY

from infergrid.constants import RESOURCE_GPU
from scheduler_extender.app import ExtenderService
from scheduler_extender.binder import Binder
from scheduler_extender.pending_binds import BindBarrier, PendingBinds
from tests.scheduler_extender.answers import Answer
from tests.scheduler_extender.test_http import NOW, call, service

# --- the bookkeeping --------------------------------------------------------------------------


def test_nothing_pending_means_no_wait():
    assert PendingBinds(2.0).time_left("b", now=10.0) == 0


def test_a_filter_waits_for_another_pod_until_its_bind_or_its_deadline():
    pending = PendingBinds(2.0)
    pending.passed_filter("a", now=10.0)
    assert pending.time_left("b", now=10.5) == 1.5
    pending.decided("a")
    assert pending.time_left("b", now=10.5) == 0


def test_a_pod_never_waits_for_itself():
    pending = PendingBinds(2.0)
    pending.passed_filter("a", now=10.0)
    assert pending.time_left("a", now=10.0) == 0  # kube-scheduler retrying the same pod


def test_a_pod_that_is_never_bound_stops_holding_others_at_its_deadline():
    pending = PendingBinds(2.0)
    pending.passed_filter("a", now=10.0)
    assert pending.time_left("b", now=12.0) == 0
    assert pending.deadlines == {}


def test_a_wait_of_zero_turns_the_barrier_off():
    pending = PendingBinds(0.0)
    pending.passed_filter("a", now=10.0)
    assert pending.time_left("b", now=10.0) == 0


@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(["pass", "decide"]), st.sampled_from("abcd"), st.floats(0, 5)
        ),  # fmt: skip
        max_size=30,
    ),
    asker=st.sampled_from("abcd"),
)
def test_time_left_is_the_latest_live_deadline_of_the_other_pods(events, asker):
    pending, now, live = PendingBinds(2.0), 0.0, {}
    for kind, uid, step in events:
        now += step
        if kind == "pass":
            pending.passed_filter(uid, now)
            live[uid] = now + 2.0
        else:
            pending.decided(uid)
            live.pop(uid, None)
    others = [d for uid, d in live.items() if uid != asker and d > now]
    assert pending.time_left(asker, now) == (max(others) - now if others else 0)


# --- on the event loop ------------------------------------------------------------------------


def test_a_waiting_filter_goes_on_when_the_other_pod_is_decided():
    async def go():
        barrier = BindBarrier(wait_s=60)
        barrier.passed_filter("a")
        waiting = asyncio.create_task(barrier.wait_for_others("b"))
        while barrier.waiting == 0:
            await asyncio.sleep(0)
        barrier.decided("a")
        return await asyncio.wait_for(waiting, 30)  # woken by the bind, not the 60 s bound

    _, ran_out = asyncio.run(go())
    assert not ran_out


def test_a_filter_stops_waiting_when_the_other_pod_runs_out_of_time():
    async def go():
        barrier = BindBarrier(wait_s=0.05)
        barrier.passed_filter("a")
        return await asyncio.wait_for(barrier.wait_for_others("b"), 30)

    _, ran_out = asyncio.run(go())
    assert ran_out


def test_one_filter_never_waits_longer_than_the_bound_in_all():
    # Pods passing filter one after another (another scheduler on the same extender) must not
    # keep one filter waiting past its own bound: kube-scheduler would time the call out.
    now = [0.0]
    barrier = BindBarrier(wait_s=2.0, clock=lambda: now[0])

    async def go():
        barrier.passed_filter("a")
        waiting = asyncio.create_task(barrier.wait_for_others("b"))
        while barrier.waiting == 0:
            await asyncio.sleep(0)
        now[0] = 1.5
        barrier.passed_filter("c")  # would hold b until 3.5, and c is never bound
        barrier.decided("a")  # b looks again: 0.5 s of its own bound left
        now[0] = 2.0
        return await asyncio.wait_for(waiting, 30)

    waited, _ = asyncio.run(go())
    assert waited == 2.0


# --- through the HTTP service ------------------------------------------------------------------


class RecordingCore:
    """The API server across the seam: pods to read, and what bind writes."""

    def __init__(self, *pods: dict) -> None:
        self.pods = {pod["metadata"]["name"]: pod for pod in pods}
        self.bindings: list[tuple[str, str]] = []

    def read_namespaced_pod(self, name, namespace, **_):
        if name not in self.pods:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=json.dumps(self.pods[name]).encode())

    def create_namespaced_pod_binding(self, name, namespace, body, **_):
        self.bindings.append((name, body["target"]["name"]))
        annotations = body["metadata"].get("annotations", {})
        self.pods[name]["metadata"].setdefault("annotations", {}).update(annotations)
        return Answer()


def gpu_pod(name: str, gpus: int) -> dict:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                     "resourceVersion": "1", "annotations": {}},
        "spec": {"containers": [{"name": "engine",
                                 "resources": {"limits": {RESOURCE_GPU: str(gpus)}}}]},
    }  # fmt: skip


def with_barrier(barrier: BindBarrier, core: RecordingCore) -> ExtenderService:
    """The test_http service (the sample fleet, idle) with a recording API and `barrier`."""
    svc = service()
    svc.barrier = barrier
    svc.binder = Binder(core, svc.view, "binpack", clock=lambda: NOW, decided=barrier.decided)
    return svc


def ran_out_total() -> float:
    return REGISTRY.get_sample_value("infergrid_scheduler_extender_bind_wait_ran_out_total") or 0


def burst(wait_s: float, bind_first_pod: bool):
    """Pod a (both of h100's GPUs) passes filter; pod b (one GPU) is filtered on h100 while a's
    bind is still on its way, as kube-scheduler does; then a's bind arrives (or never does)."""
    from aiohttp.test_utils import TestClient, TestServer

    a, b = gpu_pod("a", 2), gpu_pod("b", 1)
    core = RecordingCore(a, b)
    svc = with_barrier(BindBarrier(wait_s), core)

    async def go():
        async with TestClient(TestServer(svc.app())) as http:

            async def post(path, body):
                resp = await http.post(path, data=json.dumps(body).encode())
                return await resp.json()

            first = await post("/filter", {"Pod": a, "NodeNames": ["h100"]})
            second = asyncio.create_task(post("/filter", {"Pod": b, "NodeNames": ["h100"]}))
            while svc.barrier.waiting == 0 and not second.done():
                await asyncio.sleep(0.001)
            held = not second.done()
            bound = None
            if bind_first_pod:
                bound = await post("/bind", {"PodName": "a", "PodNamespace": "default",
                                             "PodUID": "uid-a", "Node": "h100"})  # fmt: skip
            return first, held, bound, await asyncio.wait_for(second, 30)

    return (*asyncio.run(go()), core)


def test_a_filter_during_another_pods_bind_sees_that_pods_gpus_taken():
    first, held, bound, second, core = burst(wait_s=60, bind_first_pod=True)
    assert first["NodeNames"] == ["h100"]
    assert held, "the second filter must wait for the first pod's bind"
    assert bound == {"Error": ""} and core.bindings == [("a", "h100")]
    assert second["NodeNames"] == []
    assert "h100" in second["FailedNodes"]


def test_without_the_wait_the_second_filter_decides_on_a_cache_without_the_first_pod():
    first, held, _, second, _ = burst(wait_s=0, bind_first_pod=False)
    assert not held
    assert first["NodeNames"] == ["h100"] and second["NodeNames"] == ["h100"]  # the race


def test_a_pod_that_is_never_bound_holds_the_next_filter_only_until_its_wait_runs_out():
    before = ran_out_total()
    first, held, _, second, core = burst(wait_s=1.0, bind_first_pod=False)
    assert held and core.bindings == []
    assert second["NodeNames"] == ["h100"]  # nothing was placed: h100 is free
    assert ran_out_total() == before + 1


def test_a_refused_bind_releases_the_waiting_filter_too():
    # Pod a's bind is refused (it was deleted); the next filter goes on at once, and h100 is free.
    b = gpu_pod("b", 1)
    core = RecordingCore(b)  # pod a is gone from the API server
    svc = with_barrier(BindBarrier(60), core)
    svc.barrier.passed_filter("uid-a", gpu_pod("a", 2))  # bind reserves both GPUs early

    async def go():
        from aiohttp.test_utils import TestClient, TestServer

        async with TestClient(TestServer(svc.app())) as http:
            second = asyncio.create_task(
                http.post("/filter", data=json.dumps({"Pod": b, "NodeNames": ["h100"]}).encode())
            )
            while svc.barrier.waiting == 0 and not second.done():
                await asyncio.sleep(0.001)
            assert not second.done(), "the filter must wait for pod a's bind"
            bind = {"PodName": "a", "PodNamespace": "default", "PodUID": "uid-a", "Node": "h100"}
            refused = await (await http.post("/bind", data=json.dumps(bind).encode())).json()
            await asyncio.wait_for(second, 30)  # released by the bind, whatever its outcome
            again = json.dumps({"Pod": b, "NodeNames": ["h100"]}).encode()
            return refused, await (await http.post("/filter", data=again)).json()

    refused, retried = asyncio.run(go())
    assert "cannot read the pod" in refused["Error"]
    assert retried["NodeNames"] == ["h100"]  # the early reservation was released


class ReadBackWatcher(RecordingCore):
    """Records, when bind reads the pod back, whether filters still wait for that pod."""

    def __init__(self, barrier: BindBarrier, *pods: dict) -> None:
        super().__init__(*pods)
        self.barrier = barrier
        self.pending_at_read: list[bool] = []

    def read_namespaced_pod(self, name, namespace, **kw):
        self.pending_at_read.append(f"uid-{name}" in self.barrier.pending.deadlines)
        return super().read_namespaced_pod(name, namespace, **kw)


def bind_after_filter(keep_filtered_pod: bool) -> tuple[list[bool], dict]:
    a = gpu_pod("a", 2)
    barrier = BindBarrier(60)
    core = ReadBackWatcher(barrier, a)
    svc = with_barrier(barrier, core)
    barrier.passed_filter("uid-a", a if keep_filtered_pod else None)
    bind = {"PodName": "a", "PodNamespace": "default", "PodUID": "uid-a", "Node": "h100"}
    _, result = call(svc, "/bind", bind)
    return core.pending_at_read, result


def test_bind_reserves_from_the_filtered_pod_before_reading_it_back():
    pending_at_read, result = bind_after_filter(keep_filtered_pod=True)
    assert result == {"Error": ""}
    assert pending_at_read == [False]  # the waiting filters went on before the read


def test_without_the_filtered_pod_bind_reserves_after_reading_it_back():
    pending_at_read, result = bind_after_filter(keep_filtered_pod=False)
    assert result == {"Error": ""}
    assert pending_at_read == [True]
