"""Allocation of one bucket's paid cost (gateway/ledger/allocation.py), on small worked examples."""

from __future__ import annotations

import math

import pytest

from gateway.ledger.allocation import allocate_bucket, rate_bin, request_allocation, spread


@pytest.mark.parametrize(
    ("bound", "weighted"), [(1, 1), (7, 3), (10**15, 7), (3, 10**12), (2**40, 2**40 - 1)]
)
def test_rate_bin_holds_the_requests_highest_rate(bound: int, weighted: int) -> None:
    found = rate_bin(bound, weighted)
    q, e = found % 8, found // 8
    assert 4 <= q <= 7
    low, high = math.ldexp(q, e - 3), math.ldexp(q + 1, e - 3)
    assert low * weighted <= bound < high * weighted


def test_a_lone_request_on_an_idle_backend_pays_its_time_not_the_bucket() -> None:
    # $0.06 paid in the bucket; the request used the backend 9 s of 60 ($0.009): the rest is idle
    by_name, by_backend, idle = allocate_bucket(
        {"b": 60_000_000}, [("b", rate_bin(9_000_000, 3000), "k", 3000, 9_000_000)]
    )
    assert by_name == {"k": 9_000_000} and by_backend == {"b": 9_000_000} and idle == {"b": 51_000_000}


def test_a_busy_backend_is_shared_by_weighted_tokens() -> None:
    # both requests' bounds exceed their fair shares: the paid cost is split 1:3, nothing idle
    shares = [("b", rate_bin(10**9, 100), "x", 100, 10**9), ("b", rate_bin(10**9, 300), "y", 300, 10**9)]
    by_name, _, idle = allocate_bucket({"b": 1_000_001}, shares)
    assert by_name == {"x": 250_000, "y": 750_000} and idle == {"b": 1}


def test_spread_mode_leaves_no_idle_where_requests_ran() -> None:
    shares = [("b", rate_bin(10, 1), "x", 1, 10), ("b", rate_bin(10, 2), "y", 2, 10), ("c", 0, "y", 0, 0)]
    by_name, by_backend, idle = allocate_bucket({"b": 100, "c": 50}, shares, spread_idle=True)
    assert idle == {"b": 0, "c": 50} and by_backend == {"b": 100}
    assert sum(by_name.values()) == 100 and by_name["y"] > by_name["x"]


def test_spread_is_exact_and_deterministic() -> None:
    assert spread(10, {"a": 1, "b": 1, "c": 1}) == {"a": 4, "b": 3, "c": 3}
    assert spread(0, {"a": 1}) == {} and spread(5, {}) == {}


def test_request_allocation_never_exceeds_bound_or_fair_share() -> None:
    for bound in (1, 999, 10**6, 10**9):
        value = request_allocation(10**7, 5000, 1000, bound)
        assert value <= bound and value <= 10**7 * 1000 / 5000
