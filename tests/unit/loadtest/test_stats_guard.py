"""Percentile maths and the loopback guard."""

from __future__ import annotations

import pytest

from loadtest.guard import NotLoopbackError, require_loopback
from loadtest.stats import percentile, summary


def test_percentile_interpolates_between_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) is None
    assert percentile(list(range(101)), 99) == 99
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # unsorted input


def test_percentile_rejects_bad_q() -> None:
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summary() -> None:
    s = summary([float(x) for x in range(1, 11)])
    assert s["p50"] == 5.5 and s["mean"] == 5.5
    assert s["p99"] == pytest.approx(9.91)
    assert summary([]) == {"p50": None, "p90": None, "p99": None, "mean": None}


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8080", "http://127.0.0.5:1/v1", "http://localhost:9", "http://[::1]:80"]
)
def test_loopback_urls_pass(url: str) -> None:
    assert require_loopback(url) == url


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1:8080",
        "http://192.168.1.2",
        "https://api.openai.com/v1",
        "http://example.com",
        "ftp://127.0.0.1",
        "http://0.0.0.0:8080",
        "http://127.0.0.1.nip.io",
    ],
)
def test_other_urls_are_refused(url: str) -> None:
    with pytest.raises(NotLoopbackError):
        require_loopback(url)


async def test_the_runner_refuses_a_remote_gateway() -> None:
    from loadtest.runner import RunLimits, run_open_loop

    with pytest.raises(NotLoopbackError):
        await run_open_loop("http://10.1.2.3:8080", [], RunLimits())


def test_the_load_generator_drops_idle_connections_before_the_gateway_does() -> None:
    # Reusing a connection at the moment the gateway closes it for idling fails the request with a
    # connection error that is the harness's, not the gateway's: after each burst of `bursty` hundreds of
    # connections sit idle (21 such errors at 45/s in real time before the client dropped them first).
    from gateway.config.settings import ConnectionLimits
    from loadtest.runner import CLIENT_KEEPALIVE_S

    assert ConnectionLimits().keep_alive_timeout / 2 > CLIENT_KEEPALIVE_S
