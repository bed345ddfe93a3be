"""What the ledger stores about one request, and the totals it keeps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import msgspec

UsageSource = Literal["backend", "estimated"]
Dimension = Literal["backend", "pool", "vendor", "model", "key", "class"]
DIMENSIONS: tuple[Dimension, ...] = ("backend", "pool", "vendor", "model", "key", "class")
GPU_DIMENSIONS: tuple[Dimension, ...] = ("backend", "pool", "vendor")
"""Dimensions whose rows own GPUs (and so have paid and idle cost); the others only get allocations."""


@dataclass(slots=True)
class UsageRecord:
    request_id: str
    """Made by the gateway (128 random bits), once per client request: the ledger's idempotency key."""
    endpoint: str
    model: str
    backend: str
    pool: str
    vendor: str
    accelerator: str
    key: str
    request_class: str
    route: str
    stream: bool
    status: int
    prompt_tokens: int
    completion_tokens: int
    usage_source: UsageSource
    """`backend` when the backend reported usage; `estimated` when a stream ended before it could."""
    ttft_s: float | None
    duration_s: float
    cost_usd: float
    finished_at: float
    busy_s: float = 0.0
    """The request's share of its backend's time: duration / requests in flight when it was sent."""
    # What a replay of the request needs besides the above (loadtest/whatif reads them from the access
    # log): the inputs of classification, and keys of the prompt's start (never its text).
    prompt_estimate: int = 0
    """The gateway's estimate of the prompt's tokens, which class rules and `context-fits` read."""
    max_tokens: int | None = None
    n: int = 1
    priority: str | None = None
    class_header: str | None = None
    """`x-switchyard-class`, as the client sent it."""
    tenant: str | None = None
    session: str | None = None
    """The session id (prefix affinity's key); the access log writes only a hash of it."""
    affinity: str = ""
    """A hash of what `prefix-affinity` keys on: the session, else the prompt's first 512 characters."""
    prefix: list[str] | None = None
    """Chain hashes of the prompt's leading 1024-character blocks (gateway/telemetry/logs.py)."""
    bound_nusd: int = 0
    """The most this request may be allocated: price x GPUs x its time on the backend, in nano-USD."""
    client_request_id: str | None = None
    """The client's `x-request-id` (validated), for logs only: never used for accounting."""
    queued_s: float = 0.0
    """Seconds the request waited for room (back-pressure) before it was sent: it arrived that long
    before `duration_s` starts (a replay needs its arrival)."""
    prompt_chars: int = 0
    """The prompt's characters, which the estimate divides (a replay estimates again from them)."""


LOGGER = "switchyard.access"
"""The access log's logger, named on every line."""

LEDGER_ONLY = frozenset({"accelerator", "busy_s", "bound_nusd", "session", "finished_at"})
"""`UsageRecord` fields the access log does not write (`finished_at` is its `ts`; a session id only as
the `affinity` hash)."""


class AccessLine(msgspec.Struct, omit_defaults=True):
    """One line of the access log (gateway/telemetry/logs.py writes it, loadtest/whatif/ reads it back):
    a `UsageRecord`'s fields under the same names, `finished_at` as `ts`, plus the log's own (level,
    logger, an error's code and message, the body when prompts are logged). What the ledger keeps and the
    log leaves out is `LEDGER_ONLY`; tests/unit/telemetry/test_access_record.py holds the three together."""

    ts: float
    request_id: str = ""
    endpoint: str = ""
    status: int = 0
    model: str = ""
    stream: bool = False
    backend: str = ""
    pool: str = ""
    vendor: str = ""
    request_class: str = msgspec.field(default="", name="class")
    route: str = ""
    key: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usage_source: str = ""
    cost_usd: float = 0.0
    ttft_s: float | None = None
    duration_s: float | None = None
    error_code: str | None = None
    error: str | None = None
    request_body: str | None = None
    prompt_estimate: int = 0
    max_tokens: int | None = None
    n: int = 1
    priority: str | None = None
    class_header: str | None = None
    tenant: str | None = None
    affinity: str = ""
    prefix: list[str] | None = None
    level: str = "info"
    logger: str = LOGGER
    client_request_id: str | None = None
    """The client's `x-request-id`, when it sent one (request_id is the gateway's)."""
    queued_s: float = 0.0
    """Seconds it waited for room before it was sent (it arrived at ts - duration_s - queued_s)."""
    prompt_chars: int = 0
    """The prompt's characters: a replay estimates its tokens again from them, as the gateway would."""
    session_hash: str | None = None
    """A hash of the request's session id (`x-session-id`, or the body's `user`), never the id itself: a
    replay sends a session's next request only after its previous answer (loadtest/whatif/sessions.py)."""


@dataclass(slots=True)
class Totals:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    errors: int = 0
    estimated: int = 0

    def add(self, record: UsageRecord) -> None:
        self.requests += 1
        self.prompt_tokens += record.prompt_tokens
        self.completion_tokens += record.completion_tokens
        self.cost_usd += record.cost_usd
        if record.status >= 400:
            self.errors += 1
        if record.usage_source == "estimated":
            self.estimated += 1

    def merge(self, other: Totals) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cost_usd += other.cost_usd
        self.errors += other.errors
        self.estimated += other.estimated

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class CostRow:
    name: str
    price_per_gpu_hour: float | None
    gpu_hours: float | None
    utilisation: float | None
    requests: int
    prompt_tokens: int
    completion_tokens: int
    paid_usd: float | None
    """GPU time paid for (rows that own GPUs; None for model, key and class rows)."""
    allocated_usd: float
    """Paid cost allocated to the row's requests (gateway/ledger/allocation.py)."""
    idle_usd: float | None
    """Paid cost no request used (rows that own GPUs; the `(idle)` row of other dimensions)."""
    spend_usd: float
    """Paid for GPU rows, allocated for the others: what the row's $/Mtok figures divide."""
    paid_nusd: int | None
    allocated_nusd: int
    idle_nusd: int | None
    input_usd_per_mtok: float | None
    output_usd_per_mtok: float | None
    blended_usd_per_mtok: float | None
    usd_per_weighted_token: float | None


class Ledger(Protocol):
    """Where usage goes. `record` never blocks and never raises into the request path."""

    @property
    def idle_cost(self) -> str:
        """`idle` or `spread` (`ledger.idle_cost`): how reports treat GPU time no request used."""
        ...

    def record(self, record: UsageRecord) -> None: ...

    def measured_cost(self, backend: str, prompt_tokens: int, completion_tokens: int) -> float | None:
        """USD for these tokens at the backend's measured cost (None until the ledger has measured it)."""
        ...

    def recent(self, limit: int) -> list[UsageRecord]: ...

    def stats(self) -> dict[str, int | str | None]:
        """Buffer and flush counters (records waiting, dropped on overflow, flush errors)."""
        ...

    async def read_totals(self, by: Dimension) -> dict[str, Totals]: ...

    async def costs(self, by: Dimension, window: str) -> list[CostRow]: ...

    async def report(self, by: Dimension, window: str) -> tuple[list[CostRow], dict[str, int]]: ...

    async def flush(self) -> bool: ...

    async def start(self) -> None: ...

    async def close(self) -> None:
        """Stop the background tasks; flushes what is still buffered."""
        ...
