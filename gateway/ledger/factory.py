"""Choose the ledger store from the `ledger:` settings: Redis when a URL is set, else in memory."""

from __future__ import annotations

from collections.abc import Sequence

from backends.models import Backend
from gateway.config.settings import LedgerOptions
from gateway.ledger.base import LedgerBase
from gateway.ledger.memory import InMemoryLedger
from gateway.ledger.records import Dimension, Totals, UsageRecord


class NullLedger(LedgerBase):
    """Records nothing (`store: none`): the baseline of the accounting benchmark."""

    kind = "none"

    def record(self, record: UsageRecord) -> None:
        return None

    async def read_totals(self, by: Dimension) -> dict[str, Totals]:
        return {}

    async def _window(self, by: Dimension, buckets: list[int]) -> list:
        return []

    async def _claim_paid(self, claims: dict[int, int], backends: list[str]) -> None:
        return None


def build_ledger(options: LedgerOptions, backends: Sequence[Backend]) -> LedgerBase:
    store = options.store
    if store == "auto":
        store = "redis" if options.redis_url else "memory"
    if store == "redis":
        from gateway.ledger.redis_store import RedisLedger

        return RedisLedger(options, backends)
    if store == "none":
        return NullLedger(options, backends)
    return InMemoryLedger(options=options, backends=backends)
