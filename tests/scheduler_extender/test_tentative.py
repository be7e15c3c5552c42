"""Tentative reservations: prioritize holds a pod's placement on the node it ranks first, so the
next pod of a burst is placed on a cache that holds it without waiting for its bind; bind
confirms or moves the hold, and a hold with no bind runs out."""

from __future__ import annotations

import asyncio
import json
from itertools import product

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from infergrid.assignment_annotation import decode_assignment
from infergrid.constants import (
    ANNOTATION_PLACEMENT_POLICY,
    POLICY_BINPACK,
    POLICY_SPREAD,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
)
from infergrid.errors import ContractError
from infergrid.settings import parse_settings
from scheduler_extender.binder import Binder
from scheduler_extender.config import SETTINGS, ExtenderConfig
from scheduler_extender.tentative import (
    Reserver,
    bind_outcome,
    deadline,
    predicted_node,
    sole_top,
)
from tests.scheduler_extender.test_binder import ApiServer
from tests.scheduler_extender.test_http import NOW, call, envelopes, json_values, service
from tests.scheduler_extender.test_pending_binds import gpu_pod

L4S = ["l4-0", "l4-1"]
TIMEOUT_S = 10.0

# --- the decisions -----------------------------------------------------------------------------


@pytest.mark.parametrize(("held", "bind"), list(product([None, "a", "b"], ["a", "b"])))
def test_bind_places_without_a_hold_confirms_one_on_its_node_and_moves_one_elsewhere(held, bind):
    expected = "place" if held is None else "confirm" if held == bind else "move"
    assert bind_outcome(held, bind) == expected


def test_a_hold_runs_out_its_timeout_after_it_was_made():
    assert deadline(100.0, 10.0) == 110.0


def test_the_predicted_node_is_the_first_asked_about_among_those_with_the_top_score():
    assert predicted_node({"m": 3, "z": 10, "a": 10, "b": 10}) == ("z", ["a", "b"])
    assert predicted_node({"a": 10, "z": 10, "m": 3}) == ("a", ["z"])
    assert predicted_node({"m": 3, "a": 7}) == ("a", [])


@pytest.mark.parametrize("scores", [{}, {"a": 0, "b": 0}], ids=["no nodes", "none fits"])
def test_nothing_is_predicted_where_no_node_scores(scores):
    assert predicted_node(scores) == (None, [])


@given(st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 10), min_size=1))
def test_sole_top_makes_the_predicted_node_the_only_best_and_keeps_every_other_order(scores):
    chosen, tied = predicted_node(scores)
    after = sole_top(scores, tied)
    if chosen is None:
        assert after == scores
        return
    assert after[chosen] == scores[chosen] == max(scores.values())
    assert all(s < after[chosen] for n, s in after.items() if n != chosen)
    for x, y in product(scores, repeat=2):
        if scores[x] >= scores[y] and chosen not in (x, y):
            assert after[x] >= after[y]
        assert 0 <= scores[x] - after[x] <= 1


# --- through the service -----------------------------------------------------------------------


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reserving(api: ApiServer, clock: Clock | None = None):
    """The test_http service (the sample fleet, idle) over `api`, holding placements at
    prioritize for TIMEOUT_S, and no wait at filter."""
    svc = service()
    svc.binder = Binder(api, svc.view, POLICY_BINPACK, clock=lambda: NOW)
    svc.reserver = Reserver(
        svc.view, POLICY_BINPACK, TIMEOUT_S, clock=lambda: NOW, monotonic=clock or Clock()
    )
    return svc


def share(name: str, mib: int, policy: str = POLICY_BINPACK) -> dict:
    pod = gpu_pod(name, 0)
    pod["metadata"]["annotations"] = {ANNOTATION_PLACEMENT_POLICY: policy}
    limits = {RESOURCE_VGPU: "1", RESOURCE_GPU_MEMORY: str(mib)}
    pod["spec"]["containers"][0]["resources"]["limits"] = limits
    return pod


def bind(name: str, node: str) -> dict:
    return {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}", "Node": node}


def run(svc, steps: list[tuple[str, dict]]) -> list[object]:
    """Posts each (path, body) in order on one server; the answers."""

    async def go():
        async with TestClient(TestServer(svc.app())) as http:
            out = []
            for path, body in steps:
                resp = await http.post(path, data=json.dumps(body).encode())
                out.append(await resp.json())
            return out

    return asyncio.run(go())


def counted(event: str) -> float:
    name = "infergrid_scheduler_extender_tentative_reservations_total"
    return REGISTRY.get_sample_value(name, {"event": event}) or 0


def top(scores: list[dict]) -> list[str]:
    best = max(s["Score"] for s in scores)
    return [s["Host"] for s in scores if s["Score"] == best]


def node_of(api: ApiServer, name: str) -> str:
    return decode_assignment(api.assignment(name)).node


def test_the_next_pod_of_a_burst_sees_the_held_pod_before_its_bind():
    a, b = gpu_pod("a", 2), gpu_pod("b", 1)
    svc = reserving(ApiServer(a, b))
    made = counted("made")
    _, second = run(svc, [("/prioritize", {"Pod": a, "NodeNames": ["h100"]}),
                          ("/filter", {"Pod": b, "NodeNames": ["h100"]})])  # fmt: skip
    assert second["NodeNames"] == [] and "h100" in second["FailedNodes"]  # no wait, no race
    assert counted("made") == made + 1


def test_ties_at_the_top_are_broken_toward_the_held_node_so_kube_scheduler_binds_it():
    a, b = share("a", 4096), share("b", 4096)
    svc = reserving(ApiServer(a, b))
    first, second = run(svc, [("/prioritize", {"Pod": a, "NodeNames": L4S}),
                              ("/prioritize", {"Pod": b, "NodeNames": L4S})])  # fmt: skip
    assert top(first) == ["l4-0"]  # the two idle L4 nodes tie; the first asked is held
    assert {s["Host"]: s["Score"] for s in first}["l4-1"] == 9
    assert top(second) == ["l4-0"]  # binpack: onto a's node, which it already sees taken


def test_a_spread_burst_goes_to_a_new_node_each_time_without_waiting():
    a, b = share("a", 4096, POLICY_SPREAD), share("b", 4096, POLICY_SPREAD)
    svc = reserving(ApiServer(a, b))
    first, second = run(svc, [("/prioritize", {"Pod": a, "NodeNames": L4S}),
                              ("/prioritize", {"Pod": b, "NodeNames": L4S})])  # fmt: skip
    assert top(first) == ["l4-0"] and top(second) == ["l4-1"]


def test_bind_on_the_held_node_confirms_the_hold_and_records_its_placement():
    a = share("a", 4096)
    api = ApiServer(a)
    svc = reserving(api)
    confirmed = counted("confirmed")
    run(svc, [("/prioritize", {"Pod": a, "NodeNames": L4S})])
    held = svc.view.cache.tentative("uid-a")
    assert held is not None
    assert call(svc, "/bind", bind("a", "l4-0"))[1] == {"Error": ""}
    assert decode_assignment(api.assignment("a")) == held.assignment
    assert svc.view.cache.reserved("uid-a")  # bind's now, until the watch brings the pod
    assert counted("confirmed") == confirmed + 1


def test_bind_on_another_node_moves_the_hold_there():
    a, b = share("a", 20000), share("b", 20000)
    api = ApiServer(a, b)
    svc = reserving(api)
    moved = counted("moved")
    run(svc, [("/prioritize", {"Pod": a, "NodeNames": L4S})])  # held on l4-0
    assert call(svc, "/bind", bind("a", "l4-1"))[1] == {"Error": ""}
    assert node_of(api, "a") == "l4-1" and counted("moved") == moved + 1
    assert svc.view.cache.assignments_on("l4-0") == []  # l4-0 is free again
    (scores,) = run(svc, [("/prioritize", {"Pod": b, "NodeNames": L4S})])
    assert top(scores) == ["l4-1"]  # binpack: where a is, as the cache knows now


def test_a_hold_with_no_bind_runs_out_and_frees_its_gpus():
    a, b = gpu_pod("a", 2), gpu_pod("b", 1)
    clock = Clock()
    svc = reserving(ApiServer(a, b), clock)
    expired = counted("expired")
    run(svc, [("/prioritize", {"Pod": a, "NodeNames": ["h100"]})])
    clock.now += TIMEOUT_S - 0.001
    (full,) = run(svc, [("/filter", {"Pod": b, "NodeNames": ["h100"]})])
    clock.now += 0.001
    (free,) = run(svc, [("/filter", {"Pod": b, "NodeNames": ["h100"]})])
    assert full["NodeNames"] == [] and free["NodeNames"] == ["h100"]
    assert counted("expired") == expired + 1


def test_a_pod_scheduled_again_is_not_weighed_against_its_own_hold():
    a = gpu_pod("a", 2)
    svc = reserving(ApiServer(a))
    released = counted("released")
    _, again = run(svc, [("/prioritize", {"Pod": a, "NodeNames": ["h100"]}),
                         ("/filter", {"Pod": a, "NodeNames": ["h100"]})])  # fmt: skip
    assert again["NodeNames"] == ["h100"] and counted("released") == released + 1


def test_a_lone_feasible_node_is_held_at_filter_as_kube_scheduler_skips_prioritize():
    a = gpu_pod("a", 3)
    svc = reserving(ApiServer(a))
    run(svc, [("/filter", {"Pod": a, "NodeNames": ["h100", "l4-0"]})])  # h100 has two GPUs
    held = svc.view.cache.tentative("uid-a")
    assert held is not None and held.node == "l4-0"


def test_a_bound_pod_is_refused_and_its_hold_released():
    a = gpu_pod("a", 2)
    a["spec"]["nodeName"] = "a100-0"  # bound by someone else, and the watch not there yet
    api = ApiServer(a)
    svc = reserving(api)
    run(svc, [("/prioritize", {"Pod": gpu_pod("a", 2), "NodeNames": ["h100"]})])
    _, result = call(svc, "/bind", bind("a", "h100"))
    assert result["Error"] == "pod default/a is already bound to node a100-0"
    assert api.bindings == [] and svc.view.cache.assignments_on("h100") == []


def test_the_read_back_request_decides_over_the_held_one():
    api = ApiServer(gpu_pod("a", 2))  # the API server's pod a asks for two GPUs
    svc = reserving(api)
    run(svc, [("/prioritize", {"Pod": gpu_pod("a", 1), "NodeNames": ["h100"]})])  # one held
    assert call(svc, "/bind", bind("a", "h100"))[1] == {"Error": ""}
    assert sum(len(c.gpus) for c in decode_assignment(api.assignment("a")).containers) == 2


def test_a_bind_after_the_hold_ran_out_places_the_pod_as_without_one():
    clock = Clock()
    api = ApiServer(gpu_pod("a", 1))
    svc = reserving(api, clock)
    run(svc, [("/prioritize", {"Pod": gpu_pod("a", 1), "NodeNames": ["h100"]})])
    clock.now += TIMEOUT_S
    svc.reserver.expire()
    assert call(svc, "/bind", bind("a", "h100"))[1] == {"Error": ""}
    assert node_of(api, "a") == "h100"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["/filter", "/prioritize"]), envelopes | json_values)
def test_fuzzed_bodies_never_get_a_500_with_holds_on(path, body):
    status, result = call(reserving(ApiServer()), path, json.dumps(body).encode())
    assert status in (200, 400)
    if isinstance(result, dict):
        assert not result["Error"].startswith("internal error")


# --- settings ----------------------------------------------------------------------------------


def test_by_default_holds_last_10_s_and_filters_do_not_wait():
    cfg = ExtenderConfig()
    assert (cfg.tentative_reservation_s, cfg.bind_wait_s) == (10.0, 0.0)


@pytest.mark.parametrize("value", [-1, 301, "10s", True])
def test_a_bad_hold_timeout_is_refused_naming_the_setting(value):
    with pytest.raises(ContractError, match="tentativeReservationSeconds"):
        parse_settings({"version": "v1", "tentativeReservationSeconds": value}, SETTINGS)


def test_a_hold_timeout_of_0_turns_holds_off():
    assert parse_settings({"version": "v1", "tentativeReservationSeconds": 0}, SETTINGS) == {
        "tentative_reservation_s": 0.0
    }
