"""Redis key names. Every key carries the hash tag `{sy:<prefix>}`, so on Redis Cluster all of one
deployment's keys live in one slot and a batch script may touch any of them.

    {sy:P}:req:<request id>          "1", EX dedupe_ttl: this (gateway-made) request id is counted (SET NX)
    {sy:P}:tot:<dim>                 hash, all-time totals; field "<metric>|<name>"
    {sy:P}:m:<bucket start>:<dim>    hash, one time bucket (EXPIRE retention); field "<metric>|<name>";
                                     the backend hash also holds "paid_ms|<backend>"; allocation sums
                                     "aw|<backend>|<rate bin>|<name>" and "ab|..." (allocation.py)
dim: backend, pool, vendor, model, key, class. metric: req, in, out, busy_us, cost_nusd, err, est
(see gateway/ledger/costs.py). Scripts are routed by KEYS[1] (the backend totals key) and build the
other names from the same tag, so they stay on its slot.
"""

from __future__ import annotations


class Keys:
    def __init__(self, prefix: str) -> None:
        self.tag = "{sy:" + prefix + "}"

    def totals(self, dim: str) -> str:
        return f"{self.tag}:tot:{dim}"

    def bucket(self, start: int, dim: str) -> str:
        return f"{self.tag}:m:{start}:{dim}"

    def request(self, request_id: str) -> str:
        return f"{self.tag}:req:{request_id}"

    @property
    def route(self) -> str:
        """The key every script names in KEYS, so Redis Cluster routes it to this deployment's slot."""
        return self.totals("backend")

    @property
    def pattern(self) -> str:
        return self.tag.replace("{", "\\{").replace("}", "\\}") + ":*"
