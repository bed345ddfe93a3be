"""The token ledger: one record per request (keyed by the gateway's request id), totals by backend, pool,
vendor, model, key and class, what every backend really costs per token, and who its cost is allocated to.

- records.py: the record and the `Ledger` interface; costs.py: the cost rules and the table;
  allocation.py: paid = allocated + idle per bucket and backend (integer nano-USD);
  base.py: paid-time ticker and cost refresher shared by the stores; memory.py: the in-memory store;
  redis_store.py (+ keys.py, scripts.py): the Redis store; factory.py: which store the settings choose.
- Redis is used whenever `ledger.redis_url` is set; on Redis Cluster every key carries the hash tag
  `{sy:<key_prefix>}` so each batch script stays on one slot (key layout in keys.py).
"""
