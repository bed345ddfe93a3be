"""Switchyard in `auth.mode: keys` for the side-by-side peers harness (`make bench-peers-keys`).

The harness sends one fixed API key (`--api-key`) and starts each gateway with one command, so this
wrapper provisions that key (and its team) in Redis through the tenants store, with every limit set (RPM,
TPM, parallel, a dollar budget) at values the load never reaches, so every check runs and none refuses;
then it replaces itself with `switchyard serve` on the peers mock config plus the `auth` section.
`--cleanup` deletes what a run left under the prefix.

Usage: python -m loadtest.bench.peers_keys --port PORT --key sy-... [--prefix P] | --cleanup [--prefix P]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TypedDict

import redis.asyncio as aioredis
import yaml

from gateway.tenants.keys import KeyRecord, TeamRecord, hash_key, new_key_id
from gateway.tenants.store_redis import RedisTenantStore
from loadtest.bench._util import delete_prefix

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/0"
PEERS_CONFIG = ROOT / "loadtest" / "configs" / "peers-mock.yaml"


class _Limits(TypedDict):
    rpm: int
    tpm: int
    max_parallel: int
    budget_usd: float


LIMITS: _Limits = {"rpm": 10**9, "tpm": 10**12, "max_parallel": 10**6, "budget_usd": 10**6}


async def _provision(material: str, prefix: str) -> None:
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        store = RedisTenantStore(client, prefix)
        await store.put_team(TeamRecord(name="bench", **LIMITS))
        record = KeyRecord(
            id=new_key_id(),
            name="bench",
            team="bench",
            created_at=time.time(),
            hash=hash_key(material),
            budget_period="day",
            **LIMITS,
        )
        await store.put_key(record)
    finally:
        await client.aclose()


def _workdir(prefix: str) -> Path:
    """Holds the gateway's config, so its batch files too (relative to the config); `--cleanup` removes it."""
    return Path(tempfile.gettempdir()) / prefix


def _cleanup(prefix: str) -> int:
    shutil.rmtree(_workdir(prefix), ignore_errors=True)
    return delete_prefix(REDIS_URL, prefix)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int)
    parser.add_argument("--key", help="the key material the harness sends (sy-...)")
    parser.add_argument("--prefix", default="peers-bench-keys")
    parser.add_argument("--cleanup", action="store_true")
    args = parser.parse_args(argv)
    if args.cleanup:
        print(f"deleted {_cleanup(args.prefix)} Redis keys under {args.prefix}")
        return 0
    if args.port is None or not args.key:
        parser.error("--port and --key are required")
    asyncio.run(_provision(args.key, args.prefix))
    config = yaml.safe_load(PEERS_CONFIG.read_text())
    config["ledger"] = {**config.get("ledger", {}), "key_prefix": args.prefix}
    config["auth"] = {"mode": "keys", "store": "redis", "redis_url": REDIS_URL, "replicas": 3}
    workdir = _workdir(args.prefix)
    workdir.mkdir(exist_ok=True)
    path = workdir / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    switchyard = str(Path(sys.executable).with_name("switchyard"))
    argv_serve = [
        switchyard,
        "serve",
        "--config",
        str(path),
        "--port",
        str(args.port),
        "--log-level",
        "warning",
    ]
    os.execv(switchyard, argv_serve)
    return 1  # unreachable


if __name__ == "__main__":
    raise SystemExit(main())
