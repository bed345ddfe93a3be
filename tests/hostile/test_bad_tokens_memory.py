"""100,000 requests with distinct bad API keys do not grow the gateway's memory (issue 33, item 3).

A gateway in `auth.mode: keys` on the real Redis gets half malformed tokens (any text, up to 4 KB) and
half well-formed ones that name no key, over 8 keep-alive connections with pipelined requests. Its
resident memory (`VmRSS` of the serving process) after them is within 10 MB of before, and a real key
still works.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from tests.support import clean_redis, running_gateway

MODEL = "llama-3.1-8b"
FLEET = f"""
model: {MODEL}
max_model_len: 4096
groups:
  - {{pool: h100, vendor: nvidia, accelerator: h100, count: 1, price_per_gpu_hour: 2.9, ttft_ms: 2,
      tpot_ms: 1}}
"""
ADMIN_KEY = "sy-test-admin-" + uuid.uuid4().hex
REQUESTS = 100_000
WARM_UP = 5_000
CONNECTIONS = 8
PIPELINE = 64
BURST_BYTES = 24 * 1024
GROWTH_LIMIT_KB = 10 * 1024
BODY = b'{"model":"llama-3.1-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'


@dataclass
class Gateway:
    base: str
    pid: int


def _serving_pid(config_path: Path) -> int:
    """The gateway process started with this config (one worker: it serves the requests itself)."""
    wanted = str(config_path).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in cmdline and wanted in cmdline:
            return int(entry.name)
    raise RuntimeError(f"no gateway process serving {config_path}")


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    workdir: Path = tmp_path_factory.mktemp("bad-tokens")
    prefix = f"hostile-tokens-{uuid.uuid4().hex[:10]}"
    try:
        with Fleet(parse_fleet_spec(FLEET, "<bad tokens fleet>"), log_dir=workdir) as fleet:
            config = fleet.gateway_config(connections={"max_per_client": 256})
            config["ledger"] = {"redis_url": "redis://127.0.0.1:6379/0", "key_prefix": prefix}
            config["auth"] = {"mode": "keys"}
            config["telemetry"] = {"access_log": {"enabled": False}}
            with running_gateway(config, workdir, env={"SWITCHYARD_ADMIN_KEY": ADMIN_KEY}) as base:
                yield Gateway(base, _serving_pid(workdir / "gateway.yaml"))
    finally:
        clean_redis(prefix)


def _bad_token(i: int) -> bytes:
    if i % 2:
        return b"sy-" + secrets.token_urlsafe(32).encode()  # the keys' format, naming no key
    return f"bad-{i}-".encode() + b"z" * (i % 4096)  # any text, up to 4 KB


def _request(port: int, token: bytes) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer %s\r\ncontent-length: %d\r\n\r\n%s" % (port, token, len(BODY), BODY)
    )


async def _send_bad_tokens(port: int, total: int, first: int) -> dict[int, int]:
    """`total` requests, each with its own bad token, over keep-alive connections; statuses counted."""
    statuses: dict[int, int] = {}
    per_connection = total // CONNECTIONS

    async def connection(index: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        start = first + index * per_connection
        i, end = start, start + per_connection
        try:
            while i < end:
                # Pipelined, a burst at a time under the gateway's header bound (a burst's bytes arriving
                # before the first request is answered count as one request's headers).
                burst: list[bytes] = []
                size = 0
                while i < end and len(burst) < PIPELINE and size < BURST_BYTES:
                    burst.append(_request(port, _bad_token(i)))
                    size += len(burst[-1])
                    i += 1
                writer.write(b"".join(burst))
                await writer.drain()
                for _ in burst:
                    head = await reader.readuntil(b"\r\n\r\n")
                    status = int(head.split(b" ", 2)[1])
                    statuses[status] = statuses.get(status, 0) + 1
                    length = next(
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    )
                    await reader.readexactly(length)
        finally:
            writer.close()
            await writer.wait_closed()

    await asyncio.gather(*(connection(i) for i in range(CONNECTIONS)))
    return statuses


@pytest.mark.slow
def test_distinct_bad_tokens_do_not_grow_memory(gateway: Gateway) -> None:
    port = int(gateway.base.rsplit(":", 1)[1])
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    made = httpx.post(gateway.base + "/admin/v1/keys", json={"name": "real"}, headers=admin, timeout=10)
    assert made.status_code == 201, made.text
    real = {"authorization": f"Bearer {made.json()['key']}"}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(gateway.base + "/v1/chat/completions", json=chat, headers=real).status_code == 200

    started_kb = _rss_kb(gateway.pid)
    warm = asyncio.run(_send_bad_tokens(port, WARM_UP, 0))  # the error path's first use, buffers
    assert warm == {401: WARM_UP}
    before_kb = _rss_kb(gateway.pid)
    began = time.monotonic()
    statuses = asyncio.run(_send_bad_tokens(port, REQUESTS, WARM_UP))
    seconds = time.monotonic() - began
    after_kb = _rss_kb(gateway.pid)
    print(
        f"\nRSS at start {started_kb} KB, after {WARM_UP} warm-up requests {before_kb} KB, after "
        f"{REQUESTS} more {after_kb} KB (grew {after_kb - before_kb} KB; {REQUESTS / seconds:.0f} req/s)"
    )
    assert statuses == {401: REQUESTS}
    assert after_kb - before_kb < GROWTH_LIMIT_KB, (before_kb, after_kb)
    assert httpx.post(gateway.base + "/v1/chat/completions", json=chat, headers=real).status_code == 200
    assert os.path.exists(f"/proc/{gateway.pid}")  # the same process all along
