"""The token ledger: one record per request, totals by backend, pool, vendor, model and key, and what every
backend really costs per token.

- records.py: the record and the `Ledger` interface; costs.py: the cost rules and the table;
  base.py: paid-time ticker and cost refresher shared by the stores; memory.py: the in-memory store;
  redis_store.py (+ keys.py, scripts.py): the Redis store; factory.py: which store the settings choose.
- Redis is used whenever `ledger.redis_url` is set; on Redis Cluster every key carries the hash tag
  `{sy:<key_prefix>}` so each batch script stays on one slot (key layout in keys.py).
"""
