"""The gateway's interpreter work per request, counted: Python frames entered, bytecodes executed and C
functions called.

CPU per request on a small shared VM moves by 10-20 % from one run to the next, more than most changes to
the request path are worth; these counts move by about one frame a request between runs (a few for
streams), so a change's effect on the hot path can be told from noise (issue 38). Frames are not time: a
frame of `parse` and one of a one-line lambda count the same. Bytecodes come nearer (a function that loops
shows), though an instruction that builds a dict and one that loads a local still count the same: read
either beside a CPU figure, not instead.

How: the gateway runs under this module's `--serve` wrapper, which counts with `sys.setprofile` every
Python frame entered (a call, or a coroutine resumed: each `await` that suspends costs its whole chain
again) and every C function called, and with `sys.settrace` every bytecode each function executed (the
gateway runs many times slower meanwhile; the counts do not care), between SIGUSR1 and SIGUSR2. In
between the parent sends exactly `--requests` chat completions over 8 connections (in `keys` mode with a
key and team with every limit set, on the shared Redis), all answered 200, and divides by that number.
The upstream is nginx answering static bodies (else a small aiohttp app), the request the stream_chunks
bench sends; `--stream` streams. The requests carry httpx's few headers, or with `--client openai` go
through the official SDK and carry the fifteen or so it sends: the gateway reads every header of a
request, so what each one costs shows only there.

Usage: python -m loadtest.bench.call_counts [--mode keys|open] [--requests 2000] [--stream] [--top 30]
       [--client httpx|openai] [--json out.json]
       python -m loadtest.bench.call_counts --compare before.json after.json [--top 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import yaml

from loadtest.bench import stream_answers, stream_chunks
from loadtest.bench._util import delete_prefix, pick_cpus, start_gateway, which
from loadtest.bench.http_clients.upstream import start_upstream
from loadtest.bench.peers_keys import REDIS_URL, _provision
from loadtest.processes import ProcessGroup, free_port, install_interrupt_handlers, wait_until

ROOT = Path(__file__).resolve().parents[2]
CONNECTIONS = 8
_START, _DUMP = signal.SIGUSR1, signal.SIGUSR2


# --- the child: the gateway, counted -------------------------------------------------------------------


def _where(entry: Any) -> str:
    code, owner = entry if isinstance(entry, tuple) else (entry, "")
    if owner:
        return f"<string> {owner}.{code.co_qualname.rpartition('.')[2]}"
    path = code.co_filename
    for marker in ("site-packages/", str(ROOT) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{path}:{code.co_firstlineno} {code.co_qualname}"


class InterpreterCounts:
    """Python frames entered, C functions called and bytecodes executed in this thread, while counting."""

    def __init__(self) -> None:
        self.frames: Counter[Any] = Counter()
        self.builtins: Counter[str] = Counter()
        self.opcodes: Counter[Any] = Counter()

    def _count(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if code.co_filename == "<string>":  # generated (a dataclass's `__init__`): named by its class
                self.frames[(code, type(frame.f_locals.get("self")).__qualname__)] += 1
            else:
                self.frames[code] += 1
        elif event == "c_call":
            self.builtins[getattr(arg, "__qualname__", type(arg).__name__)] += 1

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return self._each_opcode

    def _each_opcode(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            self.opcodes[frame.f_code] += 1
        return self._each_opcode

    def start(self) -> None:
        self.frames.clear()
        self.builtins.clear()
        self.opcodes.clear()
        sys.setprofile(self._count)
        sys.settrace(self._trace)

    def stop(self) -> dict[str, dict[str, int]]:
        """Stop counting; the counts by place (`_where`): `python` frames, `c` calls, `bytecodes`."""
        sys.setprofile(None)
        sys.settrace(None)
        return {
            "python": _by_place(self.frames),
            "c": dict(self.builtins),
            "bytecodes": _by_place(self.opcodes),
        }


def _by_place(counts: Counter[Any]) -> dict[str, int]:
    """Counts by code object (or generated code and its class) as counts by `_where`: code compiled from
    one source (a policy's rules) shares a place."""
    out: Counter[str] = Counter()
    for code, n in counts.items():
        out[_where(code)] += n
    return dict(out)


def _serve(config: str, port: int, out: Path) -> None:
    """`switchyard serve`, counting between SIGUSR1 and SIGUSR2 (then written to `out` as JSON)."""
    counts = InterpreterCounts()

    def start(signum: int, frame: FrameType | None) -> None:
        counts.start()

    def dump(signum: int, frame: FrameType | None) -> None:
        written = out.with_suffix(".part")
        written.write_text(json.dumps(counts.stop()))
        written.replace(out)  # whole once `out` exists

    signal.signal(_START, start)
    signal.signal(_DUMP, dump)
    from gateway.cli.main import main  # after the handlers: the gateway's own import time is not counted

    sys.exit(main(["serve", "--config", config, "--port", str(port), "--log-level", "warning"]))


# --- the parent: the load, and the counts per request --------------------------------------------------


async def _send(url: str, key: str, body: bytes, requests: int) -> None:
    """Exactly `requests` POSTs over `CONNECTIONS` connections, each read to its end; raises on a non-200."""
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=30) as client:

        async def one() -> None:
            answer = await client.post("/v1/chat/completions", content=body)
            if answer.status_code != 200:
                raise RuntimeError(f"the gateway answered {answer.status_code}: {answer.text[:300]}")

        await _over_connections(one, requests)


async def _send_sdk(url: str, key: str, body: bytes, requests: int) -> None:
    """As `_send`, through the official `openai` SDK: the headers real applications send (some fifteen,
    its `x-stainless-*` ones among them) rather than httpx's few; the SDK raises on a non-200."""
    import openai

    request = json.loads(body)
    # `CONNECTIONS` senders, each waiting for its answer: as many connections of the SDK's pool in use
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30) as client:

        async def one() -> None:
            answer: Any = await client.chat.completions.create(**request)
            if request.get("stream"):
                async for _chunk in answer:
                    pass

        await _over_connections(one, requests)


async def _over_connections(one: Callable[[], Awaitable[None]], requests: int) -> None:
    """`one()` exactly `requests` times, by `CONNECTIONS` senders each awaiting its answer before the next."""

    async def connection(share: int) -> None:
        for _ in range(share):
            await one()

    shares = [requests // CONNECTIONS + (i < requests % CONNECTIONS) for i in range(CONNECTIONS)]
    await asyncio.gather(*(connection(s) for s in shares))


def per_request(raw: dict[str, dict[str, int]], requests: int) -> dict[str, Any]:
    """The counts over `requests`: totals and every entry, per request."""
    python = {name: n / requests for name, n in raw["python"].items()}
    c = {name: n / requests for name, n in raw["c"].items()}
    bytecodes = {name: n / requests for name, n in raw.get("bytecodes", {}).items()}
    return {
        "requests": requests,
        "python_frames": sum(python.values()),
        "c_calls": sum(c.values()),
        "bytecodes_total": sum(bytecodes.values()),
        "python": dict(sorted(python.items(), key=lambda kv: -kv[1])),
        "c": dict(sorted(c.items(), key=lambda kv: -kv[1])),
        "bytecodes": dict(sorted(bytecodes.items(), key=lambda kv: -kv[1])),
    }


def run(mode: str, requests: int, stream: bool, client: str = "httpx") -> dict[str, Any]:
    gw_cpu, load_cpu = pick_cpus()
    prefix = "bench-calls-" + uuid.uuid4().hex[:8]
    key = "sy-bench-calls-" + uuid.uuid4().hex[:31]  # 43 characters after `sy-`, as real keys
    with tempfile.TemporaryDirectory(prefix="bench-calls-") as tmp:
        work = Path(tmp)
        group = ProcessGroup(work)
        try:
            kind = "nginx" if which("nginx", "/usr/sbin", "/usr/local/sbin") else "aiohttp"
            upstream = start_upstream(group, kind, load_cpu, work)
            if mode == "keys":
                asyncio.run(_provision(key, prefix))
            port = free_port()
            upstreams = {"json": upstream.json_base, "stream": upstream.stream_base}
            config = stream_chunks._config(port, upstreams, prefix)  # keys mode, ledger and metrics on
            if mode == "open":
                del config["auth"]
            path = work / "gateway.yaml"
            path.write_text(yaml.safe_dump(config))
            out = work / "counts.json"
            argv = [
                sys.executable,
                "-m",
                "loadtest.bench.call_counts",
                "--serve",
                str(path),
                str(port),
                str(out),
            ]
            url, child = start_gateway(group, "gateway", argv, port, gw_cpu, cwd=str(ROOT), timeout=60)
            body = stream_answers.request_body("stream" if stream else "json")
            send = _send_sdk if client == "openai" else _send
            asyncio.run(send(url, key, body, 200))  # warm: connections, caches, the key's lookup
            os.kill(child.pid, _START)
            time.sleep(0.2)  # the signal is handled between two bytecodes of the gateway's loop
            asyncio.run(send(url, key, body, requests))
            os.kill(child.pid, _DUMP)
            wait_until(out.exists, timeout=10, what="the counts", child=child)
            raw = json.loads(out.read_text())
        finally:
            group.close()
            delete_prefix(REDIS_URL, prefix)
    return {"mode": mode, "stream": stream, "client": client, **per_request(raw, requests)}


def format_table(summary: dict[str, Any], top: int) -> str:
    lines = [
        f"{summary['mode']} mode, {'streamed' if summary['stream'] else 'non-streamed'}, "
        f"from {summary.get('client', 'httpx')}, "
        f"{summary['requests']} requests: {summary['python_frames']:.1f} Python frames and "
        f"{summary['c_calls']:.1f} C calls per request, {summary.get('bytecodes_total', 0.0):.0f} bytecodes",
        "per request  Python frame (calls and coroutine resumptions)",
    ]
    lines += [f"{n:>11.2f}  {name}" for name, n in list(summary["python"].items())[:top]]
    lines.append("per request  C function")
    lines += [f"{n:>11.2f}  {name}" for name, n in list(summary["c"].items())[:top]]
    if summary.get("bytecodes"):
        lines.append("per request  bytecodes executed, by function")
        lines += [f"{n:>11.1f}  {name}" for name, n in list(summary["bytecodes"].items())[:top]]
    return "\n".join(lines)


def _by_name(entries: dict[str, float]) -> dict[str, float]:
    """Entries without their line numbers (a function that moved is the same function); the lambdas of
    one function add up."""
    out: dict[str, float] = {}
    for where, n in entries.items():
        path, _, rest = where.partition(":")
        name = f"{path} {rest.partition(' ')[2]}" if rest[:1].isdigit() else where
        out[name] = out.get(name, 0.0) + n
    return out


def compare(before: dict[str, Any], after: dict[str, Any], top: int) -> str:
    """What changed per request between two `--json` outputs, the largest changes first."""
    lines = [
        f"Python frames per request {before['python_frames']:.1f} -> {after['python_frames']:.1f}, "
        f"C calls {before['c_calls']:.1f} -> {after['c_calls']:.1f}",
        f"{'before':>8} {'after':>8} {'change':>8}  entry",
    ]
    if "bytecodes" in before and "bytecodes" in after:
        lines[0] += f", bytecodes {before['bytecodes_total']:.0f} -> {after['bytecodes_total']:.0f}"
    for kind in ("python", "c", "bytecodes"):
        if kind not in before or kind not in after:
            continue
        was, now = _by_name(before[kind]), _by_name(after[kind])
        changes = sorted(
            ((was.get(n, 0.0), now.get(n, 0.0), n) for n in set(was) | set(now)),
            key=lambda t: -abs(t[1] - t[0]),
        )
        lines += [f"{b:>8.2f} {a:>8.2f} {a - b:>+8.2f}  {kind}: {n}" for b, a, n in changes[:top] if a != b]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=("keys", "open"), default="keys")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument(
        "--client", choices=("httpx", "openai"), default="httpx", help="openai: the SDK's own headers"
    )
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--serve", nargs=3, metavar=("CONFIG", "PORT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(args.serve[0], int(args.serve[1]), Path(args.serve[2]))
        return 0
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        print(compare(before, after, args.top))
        return 0
    if not 100 <= args.requests <= 100_000 or not 1 <= args.top <= 1000:
        parser.error("--requests 100..100000, --top 1..1000")
    install_interrupt_handlers()
    summary = run(args.mode, args.requests, args.stream, args.client)
    print(format_table(summary, args.top))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
