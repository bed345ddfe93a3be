"""The closed-loop load: wrk with a Lua POST script when installed, else a bounded aiohttp generator."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.bench._util import (
    assert_loopback,
    python_argv,
    which,
)
from loadtest.bench.http_clients.payloads import (
    JSON_HEADERS,
    MAX_LOADGEN_REQUESTS,
    MODULE,
    RESULT_MARK,
    chat_request,
)
from loadtest.processes import ProcessGroup

# ------------------------------------------------------------------------------------- load generators


@dataclass
class LoadResult:
    requests: int
    duration_s: float
    errors: int
    p50_ms: float
    p99_ms: float


_WRK_LUA = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[{body}]==]
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('{mark}{{"requests":%d,"duration_us":%d,"errors":%d,"p50_us":%d,"p99_us":%d}}\\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


def _parse_result(text: str) -> LoadResult:
    for line in text.splitlines():
        if line.startswith(RESULT_MARK):
            raw = json.loads(line[len(RESULT_MARK) :])
            return LoadResult(
                requests=int(raw["requests"]),
                duration_s=raw["duration_us"] / 1e6,
                errors=int(raw["errors"]),
                p50_ms=raw["p50_us"] / 1e3,
                p99_ms=raw["p99_us"] / 1e3,
            )
    raise RuntimeError(f"load generator printed no result:\n{text[-2000:]}")


@dataclass
class LoadGen:
    kind: str
    cpu: int
    workdir: Path
    connections: int

    def argv(self, url: str, mode: str, seconds: float) -> list[str]:
        assert_loopback(url)
        if self.kind == "wrk":
            script = self.workdir / f"wrk_{mode}.lua"
            if not script.exists():
                body = chat_request(mode == "stream").decode()
                script.write_text(_WRK_LUA.format(body=body, mark=RESULT_MARK))
            wrk = which("wrk") or "wrk"
            secs = max(1, round(seconds))
            conns = f"-c{self.connections}"
            return [wrk, "-t1", conns, f"-d{secs}s", "--timeout", "10s", "-s", str(script), url]
        return python_argv(MODULE, "_loadgen", url, mode, str(self.connections), str(seconds))

    def run(self, group: ProcessGroup, url: str, mode: str, seconds: float) -> LoadResult:
        """Run one closed-loop phase; bounded by its own duration and a hard timeout here."""
        child = group.start(f"load-{self.kind}", self.argv(url, mode, seconds), cpu=self.cpu)
        try:
            child.proc.wait(timeout=seconds + 30)
        finally:
            group.stop(child)
        return _parse_result(child.log_tail(limit=100_000))


async def _closed_loop(url: str, body: bytes, connections: int, seconds: float) -> dict[str, Any]:
    import aiohttp

    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    timeout = aiohttp.ClientTimeout(total=10.0)
    connector = aiohttp.TCPConnector(limit=connections)

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.perf_counter() < deadline and len(latencies) + errors < MAX_LOADGEN_REQUESTS:
            began = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
                    await resp.read()
                    ok = resp.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            if ok:
                latencies.append(time.perf_counter() - began)
            else:
                errors += 1

    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(connections)))
    elapsed = time.perf_counter() - started
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e6 if latencies else 0.0

    return {
        "requests": len(latencies) + errors,
        "duration_us": elapsed * 1e6,
        "errors": errors,
        "p50_us": pct(0.50),
        "p99_us": pct(0.99),
    }


def run_loadgen(url: str, mode: str, connections: int, seconds: float) -> None:
    assert_loopback(url)
    result = run_async(_closed_loop(url, chat_request(mode == "stream"), connections, seconds))
    print(RESULT_MARK + json.dumps(result), flush=True)


def run_async(coro: Any) -> Any:
    with contextlib.suppress(ImportError):
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)
