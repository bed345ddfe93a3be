"""Hostile connections against a gateway, run in a process of their own at the lowest CPU priority (a real
attacker is on another machine; here it must not take the CPU the gateway and the normal clients need):
slowloris headers, slow bodies and idle keep-alives, each reopened when the gateway closes it.

Prints one JSON object: every closed connection's kind, how long the gateway took to close it counted from
when its timeout started and when that was seen; the connections still open at the end with their age; and
this process's own event-loop stalls, which delay what it sees.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from typing import Any

BODY = b'{"model":"llama-3.1-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'


async def _closed(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(OSError):
        while await reader.read(65536):
            pass


async def _drip(writer: asyncio.StreamWriter, piece: bytes, every: float, closed: asyncio.Task[None]) -> None:
    while not closed.done():
        await asyncio.sleep(every)
        if closed.done():
            return
        try:
            writer.write(piece)
            await writer.drain()
        except OSError:
            return


async def one(kind: str, host: str, port: int, source: str, deadline: float, out: dict[str, Any]) -> None:
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
        except OSError as exc:
            out["connect_errors"].append(str(exc))
            await asyncio.sleep(0.5)
            continue
        closed = asyncio.ensure_future(_closed(reader))
        if kind == "slowloris":
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            drip = asyncio.ensure_future(_drip(writer, b"X-Slow: 1\r\n", 1.5, closed))
        elif kind == "slow_body":
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY[:5]
            )
            drip = asyncio.ensure_future(_drip(writer, b" ", 1.5, closed))
        else:  # idle: a fresh connection that never sends a byte
            drip = asyncio.ensure_future(asyncio.sleep(0))
        started = time.monotonic()
        remaining = deadline - started
        done, _ = await asyncio.wait([closed], timeout=max(0.0, remaining))
        drip.cancel()
        now = time.monotonic()
        if done:
            out["closed"].append((kind, now - started, now))
        else:
            out["open_at_end"].append((kind, now - started, now))
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _lag_monitor(deadline: float, out: dict[str, Any]) -> None:
    """This process's own event-loop lag: a closure it sees late may have been seen late, not made late."""
    while time.monotonic() < deadline:
        before = time.monotonic()
        await asyncio.sleep(0.05)
        after = time.monotonic()
        if after - before > 0.1:
            out["lag"].append((after, after - before - 0.05))


async def attack(host: str, port: int, connections: int, seconds: float, sources: int) -> dict[str, Any]:
    out: dict[str, Any] = {"closed": [], "open_at_end": [], "connect_errors": [], "lag": []}
    deadline = time.monotonic() + seconds
    monitor = asyncio.ensure_future(_lag_monitor(deadline, out))
    kinds = ["slowloris", "slow_body", "idle"]
    tasks = []
    for i in range(connections):
        source = f"127.0.1.{1 + i % sources}"
        tasks.append(asyncio.ensure_future(one(kinds[i % 3], host, port, source, deadline, out)))
        if i % 50 == 49:
            await asyncio.sleep(0.05)  # ramp up over a second or so
    await asyncio.gather(*tasks)
    await monitor
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--connections", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--sources", type=int, default=10)
    args = parser.parse_args()
    os.nice(19)
    print(
        json.dumps(asyncio.run(attack("127.0.0.1", args.port, args.connections, args.seconds, args.sources)))
    )


if __name__ == "__main__":
    main()
