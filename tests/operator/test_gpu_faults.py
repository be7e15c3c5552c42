"""Replacing engine pods whose GPU turned unhealthy: after the grace period, the longest
faulted first, one at a time per service."""

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from inference_operator.gpu_faults import Replacement, pod_to_replace

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
GRACE = 60


def pod(name: str, faulted_s_ago: float | None = None, ready: bool = True, **meta) -> dict:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if faulted_s_ago is not None:
        since = (NOW - timedelta(seconds=faulted_s_ago)).isoformat().replace("+00:00", "Z")
        conditions.append({"type": "infergrid.io/GPUHealthy", "status": "False",
                           "reason": "GPUUnhealthy", "lastTransitionTime": since,
                           "message": "GPU-1 (index 1): XID 48"})  # fmt: skip
    return {"metadata": {"name": name, "uid": f"uid-{name}", **meta},
            "status": {"conditions": conditions}}  # fmt: skip


def test_a_pod_on_an_unhealthy_gpu_is_replaced_once_the_grace_period_has_passed():
    assert pod_to_replace([pod("a"), pod("b", faulted_s_ago=59)], NOW, GRACE) is None
    chosen = pod_to_replace([pod("a"), pod("b", faulted_s_ago=61)], NOW, GRACE)
    assert chosen == Replacement(
        "b", "uid-b",
        "pod b: its GPU is unhealthy since 2026-12-02T11:58:59+00:00: GPU-1 (index 1): XID 48",
    )  # fmt: skip


def test_the_pod_faulted_longest_goes_first():
    pods = [pod("a", faulted_s_ago=70), pod("b", faulted_s_ago=300), pod("c", faulted_s_ago=90)]
    assert pod_to_replace(pods, NOW, GRACE).name == "b"


def test_nothing_is_replaced_while_a_replacement_is_under_way():
    terminating = pod("old", deletionTimestamp="2026-12-02T11:59:00Z")
    assert pod_to_replace([terminating, pod("b", faulted_s_ago=600)], NOW, GRACE) is None
    starting = pod("new", ready=False)
    assert pod_to_replace([starting, pod("b", faulted_s_ago=600)], NOW, GRACE) is None


def test_a_faulted_pod_that_is_not_ready_does_not_block_its_own_replacement():
    assert pod_to_replace([pod("b", faulted_s_ago=600, ready=False)], NOW, GRACE).name == "b"


def test_a_healthy_gpu_condition_or_an_unreadable_time_replaces_nothing():
    healthy = pod("a")
    healthy["status"]["conditions"].append({"type": "infergrid.io/GPUHealthy", "status": "True"})
    odd = pod("b", faulted_s_ago=600)
    odd["status"]["conditions"][1]["lastTransitionTime"] = "yesterday"
    assert pod_to_replace([healthy, odd], NOW, GRACE) is None
    assert pod_to_replace([{"metadata": {"name": "bare"}}], NOW, GRACE) is None


def test_a_zero_grace_period_replaces_at_once():
    assert pod_to_replace([pod("b", faulted_s_ago=0)], NOW, 0).name == "b"


@given(st.lists(st.tuples(st.none() | st.floats(0, 1000), st.booleans(), st.booleans()),
                max_size=8))  # fmt: skip
def test_only_a_faulted_pod_past_its_grace_is_ever_chosen_and_only_when_none_is_in_flight(
    states,
):
    pods = [
        pod(f"p{i}", ago, ready, **({"deletionTimestamp": "x"} if gone else {}))
        for i, (ago, ready, gone) in enumerate(states)
    ]
    chosen = pod_to_replace(pods, NOW, GRACE)
    if chosen is None:
        return
    index = int(chosen.name[1:])
    ago, _, gone = states[index]
    assert ago is not None and ago >= GRACE and not gone
    assert not any(g for _, _, g in states)
    assert all(a is not None or r for a, r, _ in states)  # no healthy replica was starting
