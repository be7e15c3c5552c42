"""Token buckets of requests and model tokens, and concurrency, per tenant."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from gateway.admission import NEVER, Admission, TokenBucket
from gateway.tenants import TenantLimits

A = TenantLimits("team-a", requests_per_s=2, burst=2)


def test_a_burst_is_admitted_then_the_rate_holds_with_a_wait_to_the_next_token():
    admission = Admission()
    decisions = [admission.admit(A, 10, now=0.0) for _ in range(3)]
    assert [d.admitted for d in decisions] == [True, True, False]
    assert decisions[2].reason == "requests" and decisions[2].retry_after_s == 0.5
    assert admission.admit(A, 10, now=0.5).admitted


def test_one_tenant_over_its_limit_leaves_another_unaffected():
    admission = Admission()
    b = TenantLimits("team-b", requests_per_s=2, burst=2)
    for _ in range(10):
        admission.admit(A, 10, now=0.0)
    assert admission.admit(b, 10, now=0.0).admitted


def test_concurrency_frees_a_slot_when_a_request_ends():
    limits = TenantLimits("c", max_concurrent=1)
    admission = Admission()
    assert admission.admit(limits, 1, now=0.0).admitted
    refused = admission.admit(limits, 1, now=0.0)
    assert (refused.admitted, refused.reason) == (False, "concurrency")
    admission.settle(limits, 1, None, now=0.1)
    assert admission.admit(limits, 1, now=0.1).admitted


def test_the_whole_reservation_must_be_there_and_is_settled_by_the_reported_usage():
    limits = TenantLimits("t", tokens_per_minute=600)  # 10 a second
    admission = Admission()
    assert admission.admit(limits, 500, now=0.0).admitted
    refused = admission.admit(limits, 101, now=0.0)  # 100 left, 101 wanted
    assert (refused.admitted, refused.reason, refused.retry_after_s) == (False, "tokens", 0.1)
    admission.settle(limits, 500, used=20, now=0.0)  # the answer was short: 480 back
    assert admission.tenants["t"].tokens.level == 580
    assert admission.admit(limits, 580, now=0.0).admitted


def test_an_answer_that_reported_no_usage_keeps_its_reservation():
    limits = TenantLimits("t", tokens_per_minute=600)
    admission = Admission()
    admission.admit(limits, 500, now=0.0)
    admission.settle(limits, 500, used=None, now=0.0)  # a stream cut short, a timeout
    assert admission.tenants["t"].tokens.level == 100


def test_a_reservation_over_the_whole_bucket_is_never_admitted_and_charges_nothing():
    limits = TenantLimits("t", tokens_per_minute=600)
    admission = Admission()
    refused = admission.admit(limits, 601, now=0.0)
    assert (refused.admitted, refused.reason) == (False, NEVER)
    assert refused.retry_after_s == math.inf
    assert admission.tenants["t"].tokens.wait_for(600, now=0.0) == 0
    assert admission.tenants["t"].in_flight == 0


def test_usage_reported_over_the_reservation_is_charged_only_the_reservation():
    """The reservation bounds what a request can cost; an engine (its owner's code) that
    reports more cannot run the caller's bucket into debt."""
    limits = TenantLimits("t", tokens_per_minute=600)
    admission = Admission()
    admission.admit(limits, 100, now=0.0)
    admission.settle(limits, 100, used=10**9, now=0.0)
    assert admission.tenants["t"].tokens.level == 500


def test_changed_limits_apply_at_once_and_keep_the_in_flight_count():
    admission = Admission()
    limits = TenantLimits("t", max_concurrent=2)
    admission.admit(limits, 1, now=0.0)
    tighter = TenantLimits("t", max_concurrent=1)
    assert not admission.admit(tighter, 1, now=0.0).admitted


@given(
    st.floats(min_value=0.1, max_value=100),
    st.floats(min_value=1, max_value=100),
    st.lists(st.floats(min_value=0, max_value=10), min_size=1, max_size=50),
)
def test_admitted_requests_never_exceed_burst_plus_rate_times_time(rate, burst, gaps):
    limits = TenantLimits("p", requests_per_s=rate, burst=burst)
    admission, now, admitted = Admission(), 0.0, 0
    for gap in gaps:
        now += gap
        admitted += admission.admit(limits, 0, now).admitted
    assert admitted <= burst + rate * now + 1e-6


def test_a_bucket_fills_up_to_its_capacity_only():
    bucket = TokenBucket(rate=1, capacity=3)
    bucket.charge(3, now=0)
    assert bucket.wait_for(1, now=100) == 0 and bucket.level == 3


# One request's life: admitted with a reservation, settled by what the engine reports.
requests = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=2000),  # reservation
        st.one_of(st.none(), st.integers(min_value=0, max_value=3000)),  # reported usage
        st.floats(min_value=0, max_value=30),  # seconds since the last one
    ),
    max_size=40,
)


@given(st.integers(min_value=1, max_value=5000), requests)
def test_a_settlement_charges_the_reported_usage_never_above_the_reservation_or_capacity(
    capacity, lives
):
    limits = TenantLimits("p", tokens_per_minute=capacity)
    admission, now = Admission(), 0.0
    for reserved, used, gap in lives:
        now += gap
        if not admission.admit(limits, reserved, now).admitted:
            continue
        bucket = admission.tenants["p"].tokens
        before = bucket.level + reserved  # the level had the request not come
        admission.settle(limits, reserved, used, now)
        charged = before - bucket.level
        assert bucket.level <= capacity
        if used is None or used >= reserved:
            assert math.isclose(charged, reserved, abs_tol=1e-6)
        else:  # less only where the refund met the capacity
            assert math.isclose(charged, used, abs_tol=1e-6) or bucket.level == capacity
