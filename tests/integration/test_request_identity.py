"""A client cannot erase requests from the ledger: the five attacks of issue 14, through the openai SDK,
against a gateway on the in-memory ledger and one on the real Redis (private key prefix).

The ledger counts a request once by an id the gateway makes (128 random bits); the client's
`x-request-id` is echoed and kept as `client_request_id`, never used for accounting. Each test uses its
own API keys, so its usage by key is its own.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from tests.integration.test_costs_ledger import FAST, FLEET, MODEL, SHARED_REDIS, _delete_prefix, key_id
from tests.support import running_gateway


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    spec = parse_fleet_spec(FLEET, "<identity fleet>")
    with Fleet(spec, log_dir=tmp_path_factory.mktemp("identity-fleet")) as running:
        yield running


@pytest.fixture(scope="module", params=["memory", "redis"])
def gateway(
    request: pytest.FixtureRequest, fleet: Fleet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    config: dict[str, Any] = fleet.gateway_config(health={"interval": 0.5, "timeout": 0.5})
    prefix = f"itest-id-{uuid.uuid4().hex[:12]}"
    if request.param == "redis":
        config["ledger"] = {"redis_url": SHARED_REDIS, "key_prefix": prefix, **FAST}
    else:
        config["ledger"] = {"store": "memory", **FAST}
    try:
        with running_gateway(config, tmp_path_factory.mktemp(f"gw-{request.param}")) as base:
            yield base
    finally:
        if request.param == "redis":
            _delete_prefix(SHARED_REDIS, prefix)


def _ask(base: str, api_key: str, request_id: str | None, max_tokens: int) -> tuple[str, int, int]:
    """One chat completion; (gateway request id, prompt tokens, completion tokens) as the client saw."""
    sdk = openai.OpenAI(base_url=base + "/v1", api_key=api_key, max_retries=0, timeout=10)
    headers = {"x-request-id": request_id} if request_id else {}
    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "count the tokens"}],
        max_tokens=max_tokens,
        extra_headers=headers,
    )
    usage = raw.parse().usage
    assert usage is not None
    if request_id:
        assert raw.headers["x-request-id"] == request_id  # echoed
    return raw.headers["x-switchyard-request-id"], usage.prompt_tokens, usage.completion_tokens


def _usage(base: str, api_key: str, expected: tuple[int, int], timeout: float = 10.0) -> tuple[int, int]:
    """(requests, completion tokens) the ledger holds for the key, once it holds `expected`."""
    deadline = time.monotonic() + timeout
    while True:
        rows = httpx.get(base + "/admin/v1/usage?by=key").json()["data"]
        row = next((r for r in rows if r["name"] == key_id(api_key)), None)
        got = (row["requests"], row["completion_tokens"]) if row else (0, 0)
        if got == expected or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def _key() -> str:
    return f"sk-{uuid.uuid4().hex[:12]}"


def test_fifty_requests_with_one_client_id_all_count(gateway: str) -> None:
    key = _key()
    sent = [_ask(gateway, key, "same-id-for-all", 100) for _ in range(50)]
    assert len({ledger_id for ledger_id, _, _ in sent}) == 50
    assert _usage(gateway, key, (50, 5000)) == (50, 5000)


def test_two_different_requests_with_one_id_both_count(gateway: str) -> None:
    key = _key()
    _ask(gateway, key, "dup-0001", 10)
    _ask(gateway, key, "dup-0001", 500)
    assert _usage(gateway, key, (2, 510)) == (2, 510)


def test_an_attacker_reusing_a_victims_ids_erases_nothing(gateway: str) -> None:
    victim, attacker = _key(), _key()
    ledger_id, _, _ = _ask(gateway, victim, "victim-0001", 1000)
    # the attacker replays the victim's client id and even the gateway id it saw, with 1-token requests
    _ask(gateway, attacker, "victim-0001", 1)
    _ask(gateway, attacker, ledger_id, 1)
    assert _usage(gateway, victim, (1, 1000)) == (1, 1000)
    assert _usage(gateway, attacker, (2, 2)) == (2, 2)


def test_gateway_ids_cannot_be_predicted(gateway: str) -> None:
    victim, attacker = _key(), _key()
    seen, _, _ = _ask(gateway, attacker, None, 1)
    assert seen.startswith("req-") and len(seen) == 36 and int(seen[4:], 16) >= 0  # 128 bits, hex
    # the old attack: claim the next ids by counting on from one seen
    n = int(seen[4:], 16)
    for i in range(1, 21):
        _ask(gateway, attacker, f"req-{n + i:032x}", 1)
    replies = [_ask(gateway, victim, None, 3) for _ in range(40)]
    ids = [seen] + [r[0] for r in replies]
    assert len(set(ids)) == 41
    gaps = {int(b[4:], 16) - int(a[4:], 16) for a, b in itertools.pairwise(ids)}
    assert len(gaps) > 1, "ids must not be sequential"
    assert _usage(gateway, victim, (40, 120)) == (40, 120)
    assert _usage(gateway, attacker, (21, 21)) == (21, 21)


def test_two_concurrent_requests_with_one_id_both_count(gateway: str) -> None:
    key = _key()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def send(tokens: int) -> None:
        try:
            barrier.wait(timeout=5)
            _ask(gateway, key, "concurrent-0001", tokens)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(t,)) for t in (30, 40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not errors, errors
    assert _usage(gateway, key, (2, 70)) == (2, 70)
