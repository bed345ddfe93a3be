"""What the admin listing says about a backend in trouble: why and when its breaker last opened, since
when its health check fails, how old its scraped load is (the console's fleet summary shows these)."""

from __future__ import annotations

import time

from backends.breaker import BreakerOptions
from backends.models import Backend, Pool
from gateway.admin.ops import backend_state

POOL = Pool(
    name="p", vendor="amd", accelerator="mi300x", gpus_per_backend=1, price_per_gpu_hour=1.0, labels={}
)


def _backend() -> Backend:
    options = BreakerOptions(failure_threshold=3, open_s=0.05, half_open_probes=1, close_after=2)
    return Backend(
        name="b", url="http://127.0.0.1:1", models=frozenset({"m"}), max_model_len=4096, pool=POOL,
        breaker_options=options,
    )  # fmt: skip


async def test_breaker_keeps_why_and_when_it_opened_and_since_when_health_fails():
    b = _backend()
    assert b.breaker.opened_at is None and b.breaker.reason == "" and b.breaker.health_failing_since is None
    before = time.time()
    b.breaker.failure("connection refused", at_once=True)
    assert b.breaker.reason == "connection refused"
    assert b.breaker.opened_at is not None and before <= b.breaker.opened_at <= time.time()
    b.health_ok = False
    b.breaker.refresh()
    since = b.breaker.health_failing_since
    assert since is not None and before <= since <= time.time()
    b.breaker.refresh()
    assert b.breaker.health_failing_since == since, "a later refresh keeps when it started failing"
    b.health_ok = True
    b.breaker.refresh()
    assert b.breaker.health_failing_since is None
    b.breaker.close()


async def test_admin_backend_state_says_why_since_when_and_how_old_its_load_is():
    b = _backend()
    state = backend_state(b)
    assert state["load_age_s"] is None, "never scraped"
    assert state["breaker_reason"] is None and state["health_failing_since"] is None
    assert state["price_per_gpu_hour"] == 1.0 and state["gpus_per_backend"] == 1
    b.load.scraped_at = time.monotonic() - 12
    b.breaker.failure("503 from the backend", at_once=True)
    b.health_ok = False
    b.breaker.refresh()
    state = backend_state(b)
    assert 12 <= state["load_age_s"] < 13
    assert state["breaker_reason"] == "503 from the backend" and state["breaker_opened_at"] is not None
    assert state["health_failing_since"] is not None and not state["healthy"]
    b.breaker.close()
