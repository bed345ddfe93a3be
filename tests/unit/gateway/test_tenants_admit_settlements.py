"""`limits.ADMIT` carrying settlements must leave Redis and answer exactly as `limits.SETTLE` followed by
an `ADMIT` that carries none: whatever the script does with a settlement (apply it first, or fold it
into the admission's own reads and writes of the same counter), the counters, their TTLs and the
verdicts are the same. Checked on random counters, settlements and batches, on the real Redis."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

import redis
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.tenants.limits import ADMIT, SETTLE
from tests.support import clean_redis

WINDOW_MS = 10**13
"""One window for the whole run (window id 0): both runs of an example see the same one."""
REPLICA = "replica-1"
PREFIX = "test-carried-" + uuid.uuid4().hex[:8]
SCOPES = ("k:a", "t:x")


@dataclass(frozen=True)
class Scope:
    name: str
    period: str
    rpm: int
    tpm: int
    par: int
    budget: int

    def arg(self) -> str:
        spend_ttl = 0 if self.period == "total" else 90_000
        return f"{self.name}|{self.period}|{self.rpm}|{self.tpm}|{self.par}|{self.budget}|{spend_ttl}|600"


@dataclass(frozen=True)
class Example:
    scopes: tuple[Scope, Scope]
    counters: dict[str, int]
    """Plain counters present before, by name under the namespace (absent: missing)."""
    slots: dict[str, dict[str, int]]
    """Per scope its slots' hash, field per replica."""
    other_alive: bool
    last_used: str
    """`none`, `old` or `now` (this second: leases are not looked at unless a request would be refused)."""
    settlements: list[tuple[str, int]]
    requests: list[tuple[int, int, int, bool]]
    """tokens, cost, number of scopes (1: the key's, 2: the key's and the team's), and whether the key's
    budget period is the other one (a period that turned between two requests of one batch)."""


def _counter_names(scope: Scope) -> list[str]:
    return [
        f"rq:{scope.name}:0",
        f"tk:{scope.name}:0",
        f"tk:{scope.name}:-1",
        f"sp:{scope.name}:{scope.period}",
        f"hd:{scope.name}:{scope.period}",
        f"sp:{scope.name}:{_other(scope).period}",
        f"hd:{scope.name}:{_other(scope).period}",
    ]


def _other(scope: Scope) -> Scope:
    """The scope in the other budget period."""
    return replace(scope, period="total" if scope.period != "total" else "d2026-11-30")


@st.composite
def examples(draw: st.DrawFn) -> Example:
    scopes = tuple(
        Scope(
            name,
            draw(st.sampled_from(["d2026-11-30", "total"])),
            draw(st.sampled_from([0, 2, 5])),
            draw(st.sampled_from([0, 60, 200])),
            draw(st.sampled_from([0, 1, 3])),
            draw(st.sampled_from([-1, 300, 1500])),
        )
        for name in SCOPES
    )
    counters: dict[str, int] = {}
    for scope in scopes:
        for name in _counter_names(scope):
            if draw(st.booleans()):
                counters[name] = draw(st.integers(0, 400))
    slots = {
        scope.name: {
            replica: n
            for replica in (REPLICA, "other")
            if (n := draw(st.integers(-1, 3))) >= 0  # -1: no field
        }
        for scope in scopes
    }
    candidates = [
        *(name for scope in scopes for name in _counter_names(scope)),
        *(f"pa:{scope.name}" for scope in scopes),
        "sp:t:never:total",
        "pa:k:gone",
    ]
    chosen = draw(st.lists(st.sampled_from(candidates), unique=True, max_size=8))
    settlements = [
        (name, draw(st.integers(-4, 4) if name.startswith("pa:") else st.integers(-300, 300)))
        for name in chosen
    ]
    requests = draw(
        st.lists(
            st.tuples(st.integers(0, 80), st.integers(0, 600), st.integers(1, 2), st.booleans()),
            min_size=1,
            max_size=4,
        )
    )
    return Example(
        scopes,  # type: ignore[arg-type]
        counters,
        slots,
        draw(st.booleans()),
        draw(st.sampled_from(["none", "old", "now"])),
        settlements,
        requests,
    )


def _setup(client: redis.Redis, ns: str, example: Example) -> None:
    for name, value in example.counters.items():
        total = name.endswith(":total")
        client.set(f"{ns}:{name}", value, px=None if total else 600_000)
    for scope, fields in example.slots.items():
        if fields:
            client.hset(f"{ns}:pa:{scope}", mapping=fields)  # type: ignore[arg-type]
            client.expire(f"{ns}:pa:{scope}", 600)
    if example.other_alive:
        client.set(f"{ns}:lease:other", 1, px=60_000)
    if example.last_used == "old":
        for scope in SCOPES:
            client.set(f"{ns}:lu:{scope}", 1)


def _second(client: redis.Redis) -> int:
    return int(client.time()[0])


def _admit_args(ns: str, example: Example, settlements: list[tuple[str, int]]) -> list[str | int]:
    args: list[str | int] = [WINDOW_MS, REPLICA, ns, len(settlements)]
    for name, delta in settlements:
        args += [f"{ns}:{name}", delta]
    for tokens, cost, count, other in example.requests:
        key, team = example.scopes
        scopes = [_other(key) if other else key, team][:count]
        args += [count, tokens, cost, *(s.arg() for s in scopes)]
    return args


def _state(client: redis.Redis, ns: str) -> dict[str, object]:
    """Every key under `ns`: its value (a hash as a dict), whether it expires; the last-used second
    as present or not (it is the clock's)."""
    out: dict[str, object] = {}
    for raw in client.scan_iter(match=f"{ns}:*", count=1000):
        key = raw.decode()
        name = key[len(ns) + 1 :]
        expires = client.pttl(key) > 0
        if client.type(key) == b"hash":
            fields: dict[bytes, bytes] = client.hgetall(key)  # type: ignore[assignment]
            value: object = {k.decode(): int(v) for k, v in fields.items()}
        elif name.startswith("lu:"):
            value = "a second"
        else:
            value = int(client.get(key) or 0)
        out[name] = (value, expires)
    return out


def _verdicts(raw: bytes) -> list[list[bytes]]:
    """The answer's lines without the time to the window's reset (the clock's)."""
    return [fields[:3] + fields[4:] for fields in (line.split(b"|") for line in raw.split(b"\n"))]


def _run(client: redis.Redis, example: Example, carried: bool) -> tuple[list[list[bytes]], dict[str, object]]:
    admit, settle = client.register_script(ADMIT), client.register_script(SETTLE)
    for _ in range(5):  # `now` must be the same second for the whole run: again if it ticked over
        ns = "{syt:" + PREFIX + "-" + uuid.uuid4().hex[:6] + "}"
        _setup(client, ns, example)
        second = _second(client)
        if example.last_used == "now":
            for scope in SCOPES:
                client.set(f"{ns}:lu:{scope}", second)
        if carried:  # the settlements ride with the admission
            raw = admit(args=_admit_args(ns, example, example.settlements))
        else:
            pairs = example.settlements
            settle(keys=[f"{ns}:{name}" for name, _ in pairs], args=[d for _, d in pairs] + [REPLICA])
            raw = admit(args=_admit_args(ns, example, []))
        if _second(client) == second:
            return _verdicts(raw), _state(client, ns)
    raise AssertionError("the clock ticked over five times in a row")


A_PERIOD_TURNS = Example(
    (Scope("k:a", "d2026-11-30", 0, 0, 0, -1), Scope("t:x", "total", 0, 0, 0, -1)),
    {"sp:k:a:total": 5},
    {"k:a": {}, "t:x": {}},
    False,
    "none",
    [("hd:k:a:total", -3), ("sp:k:a:total", -10)],
    [(1, 10, 1, False), (1, 10, 1, True)],
)
"""The second request's period is not the first's (the day ended between them): its spend and held
counters are read apart, each after its settlement (random batches rarely build this one)."""


@settings(max_examples=300, deadline=None)
@given(examples())
@example(A_PERIOD_TURNS)
def test_settlements_carried_by_an_admission_are_as_if_settled_first(example: Example) -> None:
    client = redis.Redis()
    try:
        assert _run(client, example, carried=True) == _run(client, example, carried=False)
    finally:
        clean_redis(PREFIX)
        client.close()
