"""1,000 concurrent streams through the shipped balancer config (gateway.cli.cluster.haproxy_config) all
complete: HAProxy names each client in a PROXY v2 header, so a replica's per-client connection cap
(`max_per_client`, 256) counts 125 clients of 8 streams each, not the balancer as one client of ~333.

Without the PROXY header (or with the replicas not trusting 127.0.0.1) every replica refuses the
connections past its 256th from the balancer with 429, and this test fails.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import pytest

from gateway.cli.cluster import Cluster
from tests.cluster.conftest import FLEET, MODEL

STREAMS = 1_000
CLIENTS = 125  # 127.0.0.10 ... 127.0.0.134, 8 streams each
BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "stream": True}
).encode()


@pytest.fixture(scope="module")
def slow_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The test fleet with a 3 s time to first token, so that every stream is open at once."""
    workdir = tmp_path_factory.mktemp("client-cap")
    fleet = workdir / "fleet.yaml"
    fleet.write_text(FLEET.replace("ttft_ms: 5", "ttft_ms: 3000"))
    with Cluster(workdir, fleet, replicas=3, key_prefix=f"test-cap-{uuid.uuid4().hex[:8]}") as running:
        yield running


async def _stream(port: int, source: str, start: asyncio.Event) -> str:
    """One streamed completion over its own connection from `source`: "ok", or what went wrong."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    except OSError as exc:
        return f"connect: {exc}"
    try:
        await start.wait()  # every connection is open before any request goes
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: cluster\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
        )
        answer = await asyncio.wait_for(reader.read(-1), 90)
    except (OSError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        writer.close()
    status = answer.split(b"\r\n", 1)[0]
    if not status.startswith(b"HTTP/1.1 200"):
        return status.decode(errors="replace") + " " + answer[-200:].decode(errors="replace")
    return "ok" if b"data: [DONE]" in answer else "incomplete stream"


async def _streams(port: int) -> list[str]:
    start = asyncio.Event()
    tasks = [asyncio.create_task(_stream(port, f"127.0.0.{10 + i % CLIENTS}", start)) for i in range(STREAMS)]
    await asyncio.sleep(0.5)
    start.set()
    return await asyncio.gather(*tasks)


def test_a_thousand_concurrent_streams_through_the_balancer_all_complete(slow_cluster: Cluster) -> None:
    outcomes = asyncio.run(_streams(slow_cluster.port))
    failed = [o for o in outcomes if o != "ok"]
    assert not failed, f"{len(failed)} of {STREAMS} failed, e.g. {sorted(set(failed))[:3]}"
