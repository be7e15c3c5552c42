"""Least work first; a conversation sticks to its pod while that pod is not busy."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.balancer import LEAST_LOADED, ROUND_ROBIN, Balancer, PrefixAffinity, prefix_key
from gateway.catalog import Backend
from infergrid.tracks import STABLE

PODS = [Backend("ml", f"chat-7d9f8b6c5-{s}", f"http://10.0.0.{i}:8000", STABLE)
        for i, s in enumerate(("bbbbb", "ccccc", "ddddd"))]  # fmt: skip


def work_of(table):
    return lambda key: table.get(key[1], 0.0)


@given(st.lists(st.floats(min_value=0, max_value=1000), min_size=3, max_size=3))
def test_without_a_prefix_the_least_loaded_pod_is_picked(loads):
    table = {p.pod: w for p, w in zip(PODS, loads, strict=True)}
    chosen = Balancer(LEAST_LOADED).pick(PODS, work_of(table), None)
    assert table[chosen.pod] == min(loads)


def test_equally_idle_pods_share_the_first_requests():
    balancer = Balancer(LEAST_LOADED)
    chosen = {balancer.pick(PODS, work_of({}), None).pod for _ in range(3)}
    assert chosen == {p.pod for p in PODS}


def test_a_conversation_returns_to_its_pod_while_within_the_slack():
    balancer = Balancer(LEAST_LOADED, slack=2)
    prefix = prefix_key("user\x00hello", 256)
    first = balancer.pick(PODS, work_of({}), prefix)
    table = {first.pod: 2.0}  # two more than the idle others: still within the slack
    assert balancer.pick(PODS, work_of(table), prefix) == first


def test_a_busy_pod_loses_the_conversation_to_the_least_loaded_and_it_moves_there():
    balancer = Balancer(LEAST_LOADED, slack=2)
    prefix = prefix_key("user\x00hello", 256)
    first = balancer.pick(PODS, work_of({}), prefix)
    busy = {p.pod: 1.0 for p in PODS} | {first.pod: 3.5}
    moved = balancer.pick(PODS, work_of(busy), prefix)
    assert moved != first
    assert balancer.pick(PODS, work_of({moved.pod: 0.0, first.pod: 0.0}), prefix) == moved


def test_round_robin_ignores_load():
    balancer = Balancer(ROUND_ROBIN)
    chosen = [balancer.pick(PODS, work_of({PODS[0].pod: 100.0}), None).pod for _ in range(6)]
    assert chosen == [p.pod for p in PODS] * 2


def test_prefix_keys_depend_on_the_first_characters_only():
    assert prefix_key("abcdef", 3) == prefix_key("abcxyz", 3) != prefix_key("abdxyz", 3)
    assert prefix_key("", 3) is None
    assert prefix_key("\ud800 lone surrogate", 8) is not None  # odd but valid JSON text


def test_the_affinity_table_forgets_the_least_recently_used_first():
    table = PrefixAffinity(capacity=2)
    table.put("a", ("ml", "p1"))
    table.put("b", ("ml", "p2"))
    table.get("a")
    table.put("c", ("ml", "p3"))
    assert (table.get("a"), table.get("b"), len(table)) == (("ml", "p1"), None, 2)


def test_an_unknown_policy_is_refused_by_name():
    try:
        Balancer("fastest")
    except ValueError as err:
        assert "'fastest'" in str(err) and "least-loaded" in str(err)
    else:
        raise AssertionError("accepted an unknown policy")
