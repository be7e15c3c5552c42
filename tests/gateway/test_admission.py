"""Token buckets of requests and model tokens, and concurrency, per tenant."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.admission import Admission, TokenBucket
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


def test_model_tokens_are_charged_by_estimate_and_settled_by_use():
    limits = TenantLimits("t", tokens_per_minute=600)  # 10 a second
    admission = Admission()
    assert admission.admit(limits, 500, now=0.0).admitted
    admission.settle(limits, 500, used=20, now=0.0)  # the answer was short: 480 back
    assert admission.tenants["t"].tokens.level == 580
    assert admission.admit(limits, 700, now=0.0).admitted  # a positive balance admits
    refused = admission.admit(limits, 1, now=0.0)  # now in debt by 120 tokens
    assert (refused.admitted, refused.reason) == (False, "tokens")
    assert refused.retry_after_s == 12.1  # 121 tokens at 10 a second


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
