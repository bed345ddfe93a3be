"""The kill test: SDK traffic through the gateway while one backend of four is SIGKILLed mid-run.

    python -m loadtest.bench.failover [--requests 600] [--concurrency 16] [--kill-at 0.33]

Starts a simulated fleet (2x H100 + 2x MI300X, fixed timing) and a gateway on loopback, sends
`--requests` chat requests (half streaming) through the official `openai` SDK, kills `h100-1` with
SIGKILL once `--kill-at` of them have finished, and prints: requests, failures (split into those that
had not started streaming, which must be zero, and streams cut after their first token), retried
requests and their added latency over the median of the others, and whether the gateway's ledger
matches the usage the clients received. Bounded: at most `--requests` requests, and a 120 s deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

MODEL = "llama-3.1-8b"
FLEET = f"""
model: {MODEL}
max_model_len: 8192
groups:
  - {{pool: h100, vendor: nvidia, accelerator: h100, count: 2, price_per_gpu_hour: 2.90,
      ttft_ms: 5, tpot_ms: 2}}
  - {{pool: mi300x, vendor: amd, accelerator: mi300x, count: 2, price_per_gpu_hour: 1.75,
      ttft_ms: 5, tpot_ms: 2}}
"""
SPREAD = "name: spread\nroutes:\n  default:\n    prefer: any\n    strategy: {least-outstanding: 1}\n"
GATEWAY = {
    "timeouts": {"connect": 0.5, "first_byte": 2.0, "between_chunks": 2.0},
    "health": {"interval": 0.3, "timeout": 0.3},
    "breaker": {"failure_threshold": 3, "open_s": 1.0},
    "shutdown_grace": 5,
}


@dataclass
class Outcome:
    ok: bool
    stream: bool
    started: bool
    """A stream whose first chunk reached the client."""
    error: str | None
    prompt_tokens: int
    completion_tokens: int
    received: int
    """Content chunks the client received (streams)."""
    seconds: float
    attempts: int
    backend: str


async def one(client: openai.AsyncOpenAI, index: int, stream: bool, max_tokens: int) -> Outcome:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": f"Request {index}: tell me about GPUs."}
    ]
    began = time.perf_counter()
    started, received, attempts, backend = False, 0, 1, "?"
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,
            max_tokens=max_tokens,
            stream=stream,
            stream_options={"include_usage": True} if stream else openai.omit,
        )
        attempts = int(raw.headers.get("x-switchyard-attempts", "1"))
        backend = raw.headers.get("x-switchyard-backend", "?")
        parsed: Any = raw.parse()
        if inspect.isawaitable(parsed):
            parsed = await parsed
        if not stream:
            usage = parsed.usage
            return Outcome(
                True,
                False,
                False,
                None,
                usage.prompt_tokens,
                usage.completion_tokens,
                0,
                time.perf_counter() - began,
                attempts,
                backend,
            )
        usage = None
        async for chunk in parsed:
            started = True
            if chunk.choices and chunk.choices[0].delta.content:
                received += 1
            if chunk.usage is not None:
                usage = chunk.usage
        assert usage is not None, "a whole stream ends with its usage"
        return Outcome(
            True,
            True,
            True,
            None,
            usage.prompt_tokens,
            usage.completion_tokens,
            received,
            time.perf_counter() - began,
            attempts,
            backend,
        )
    except openai.APIError as exc:
        return Outcome(
            False,
            stream,
            started,
            f"{type(exc).__name__}: {exc}",
            0,
            0,
            received,
            time.perf_counter() - began,
            attempts,
            backend,
        )


async def drive(
    base_url: str,
    total: int,
    concurrency: int,
    max_tokens: int = 24,
    at: float | None = None,
    action: Callable[[], None] | None = None,
    deadline_s: float = 120.0,
) -> list[Outcome]:
    """`total` requests (every other one streaming) from `concurrency` workers; `action()` runs once
    when `at` of them have finished."""
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="sk-bench", max_retries=0, timeout=30)
    outcomes: list[Outcome] = []
    next_index = 0
    fired = action is None
    stop_at = time.monotonic() + deadline_s

    async def worker() -> None:
        nonlocal next_index, fired
        while next_index < total and time.monotonic() < stop_at:
            index = next_index
            next_index += 1
            outcomes.append(await one(client, index, index % 2 == 1, max_tokens))
            if not fired and at is not None and len(outcomes) >= total * at:
                fired = True
                assert action is not None
                action()

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    return outcomes


def ledger_totals(base_url: str) -> dict[str, int]:
    rows = httpx.get(base_url + "/admin/v1/usage", params={"by": "vendor"}, timeout=10).json()["data"]
    return {k: sum(r[k] for r in rows) for k in ("requests", "prompt_tokens", "completion_tokens", "errors")}


def client_totals(outcomes: list[Outcome]) -> dict[str, int]:
    """What the clients were given: full usage of complete answers, and the tokens of cut streams."""
    ok = [o for o in outcomes if o.ok]
    cut = [o for o in outcomes if not o.ok and o.started]
    return {
        "requests": len(ok) + len(cut),
        "completion_tokens": sum(o.completion_tokens for o in ok) + sum(o.received for o in cut),
        "prompt_tokens_complete": sum(o.prompt_tokens for o in ok),
        "errors": len(cut),
    }


def wait_for_ledger(base_url: str, requests: int, timeout: float = 5.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        totals = ledger_totals(base_url)
        if totals["requests"] >= requests or time.monotonic() > deadline:
            return totals
        time.sleep(0.05)


def kill(fleet: Any, name: str) -> None:
    """SIGKILL one simulated backend's process group (its handle is kept by the Fleet)."""
    process = fleet._processes[name]
    os.killpg(process.pid, signal.SIGKILL)


def summarise(outcomes: list[Outcome]) -> dict[str, Any]:
    retried = [o for o in outcomes if o.ok and o.attempts > 1]
    plain = [o.seconds for o in outcomes if o.ok and o.attempts == 1]
    median = statistics.median(plain) if plain else 0.0
    added = sorted(o.seconds - median for o in retried)
    return {
        "requests": len(outcomes),
        "failed": sum(not o.ok for o in outcomes),
        "failed_before_streaming": sum(not o.ok and not o.started for o in outcomes),
        "streams_cut_mid_way": sum(not o.ok and o.started for o in outcomes),
        "retried": len(retried),
        "median_ms_not_retried": round(median * 1000, 1),
        "added_ms_retried_median": round(statistics.median(added) * 1000, 1) if added else None,
        "added_ms_retried_max": round(added[-1] * 1000, 1) if added else None,
    }


def run(requests: int, concurrency: int, kill_at: float, workdir: Path) -> dict[str, Any]:
    from backends.sim.fleet import Fleet
    from backends.sim.fleet_spec import parse_fleet_spec
    from tests.support import running_gateway

    with Fleet(parse_fleet_spec(FLEET, "<failover fleet>"), log_dir=workdir) as fleet:
        config = fleet.gateway_config(**GATEWAY)
        (workdir / "spread.yaml").write_text(SPREAD)
        config["policy"] = {"file": str(workdir / "spread.yaml")}
        with running_gateway(config, workdir) as base:
            outcomes = asyncio.run(
                drive(base, requests, concurrency, at=kill_at, action=lambda: kill(fleet, "h100-1"))
            )
            summary = summarise(outcomes)
            expected = client_totals(outcomes)
            ledger = wait_for_ledger(base, expected["requests"])
            summary["ledger_matches_clients"] = (
                ledger["requests"] == expected["requests"]
                and ledger["completion_tokens"] == expected["completion_tokens"]
                and ledger["errors"] == expected["errors"]
            )
            state = httpx.get(base + "/admin/v1/backends", timeout=10).json()
            summary["killed_backend"] = next(b for b in state["data"] if b["name"] == "h100-1")["breaker"]
            summary["retry_budget"] = state["retry_budget"]
            summary["outcomes"] = outcomes
            return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--kill-at", type=float, default=0.33)
    args = parser.parse_args(argv)
    requests = max(1, min(args.requests, 20_000))
    with tempfile.TemporaryDirectory(prefix="switchyard-failover-") as tmp:
        summary = run(requests, max(1, min(args.concurrency, 256)), args.kill_at, Path(tmp))
    summary.pop("outcomes")
    width = max(len(k) for k in summary)
    for key, value in summary.items():
        print(f"{key:<{width}}  {value}")
    return 0 if summary["failed_before_streaming"] == 0 and summary["ledger_matches_clients"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
