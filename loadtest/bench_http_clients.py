"""httpx.AsyncClient vs aiohttp.ClientSession vs Switchyard's own backend client as the forwarding client
of a bare Litestar proxy.

What it measures
    One bare Litestar proxy (``POST /v1/chat/completions``: read the body bytes, forward them upstream,
    return upstream's status and bytes) is run as three server processes: once forwarding with one
    shared ``httpx.AsyncClient`` (pooled keep-alive, limits = ``--connections``), once with one shared
    ``aiohttp.ClientSession`` (``TCPConnector(limit=--connections)``, keep-alive), once with the gateway's
    ``BackendClient`` (gateway/request/backend_http.py, the same pool size).  For each it measures

    * ``json``   - non-streaming: ~200-token request, upstream answers a fixed chat.completion with usage;
    * ``stream`` - the same request with ``"stream": true``: upstream answers 64 ``chat.completion.chunk``
      SSE events + a usage chunk + ``data: [DONE]``; the proxy relays every piece it reads from the
      upstream socket through a Litestar ``Stream`` over an async generator.

    The upstream sends each response body in one go (a static body), so the proxy usually reads a
    streamed answer in a few socket reads, not 66: this measures per-response relaying cost (connection
    pool, request/response parsing, Stream machinery, chunked encoding), not per-token pacing.

How it runs
    The proxy (uvicorn + uvloop + httptools, one worker, no access log; or ``--server granian``) is pinned
    to the first CPU; upstream and load generator share the second.  Upstream is nginx when installed
    (static bodies from a private config in a temp dir), else a small aiohttp.web server; the load
    generator is ``wrk`` (closed loop, Lua script for the POST) when installed, else a bounded aiohttp
    closed-loop generator.  Each mode gets a discarded warm-up, then one measured phase of ``--duration``
    seconds with ``--connections`` concurrent connections.  Every child runs in its own process group and
    is stopped on exit or Ctrl-C; only 127.0.0.1 is contacted.

How to read the output
    ``req/s``: completed responses per second (the proxy is the bottleneck: it has a core to itself).
    ``p50``/``p99``: client-side latency at that concurrency, in ms (closed loop, so ~ connections / req/s).
    ``CPU us/req``: user+system CPU of the proxy's process group over the measured phase / requests - the
    most stable figure; it is what the gateway pays per request for the client library plus framework.
    ``proxy CPU%``: share of its core the proxy used; well under 100 means it was not the bottleneck
    (the load side or other processes on the machine were), so its req/s understates it.
    ``aiohttp/httpx``, ``switchyard/httpx``: ratios against the httpx row; > 1 for req/s means faster,
    < 1 for latency and CPU means cheaper.  Figures move 10-40 % between runs on a shared VM: compare rows
    of one run, and use ``--reps N`` (median of N alternating rounds) when the difference is small.

Usage: ``python -m loadtest.bench_http_clients [--duration 10] [--connections 64]
[--server uvicorn|granian] [--json out.json]`` (``make bench-clients ARGS="..."``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from loadtest._bench_util import (
    Child,
    ProcessGroup,
    assert_loopback,
    free_port,
    http_post,
    install_interrupt_handlers,
    pick_cpus,
    python_argv,
    session_cpu_seconds,
    wait_until,
    which,
)

MODULE = "loadtest.bench_http_clients"
CLIENTS = ("httpx", "aiohttp", "switchyard")
MODES = ("json", "stream")
CHAT_PATH = "/v1/chat/completions"
RESULT_MARK = "BENCHJSON "
STREAM_MARK = b'"stream":true'
MAX_LOADGEN_REQUESTS = 5_000_000
_JSON_HEADERS = {"Content-Type": "application/json"}

# --------------------------------------------------------------------------------------------- payloads

_PROMPT = (
    "I am moving a small team's nightly data pipeline from a single large server to a managed cluster and "
    "would like a careful plan. The pipeline reads about forty gigabytes of compressed logs from object "
    "storage, parses them, joins them with a customer table that changes a few times a day, aggregates "
    "per hour and per region, and writes the results to a warehouse that analysts query every morning. "
    "Today it takes about five hours and sometimes fails halfway, which means someone has to restart it "
    "by hand. Please describe how to split the work into stages that can be retried on their own, how to "
    "size the cluster for the first month, what to monitor so that a failure is noticed before the "
    "analysts arrive, and how to test the new setup against the old one for a week without doubling the "
    "cost. Keep the answer short, practical and organised as a numbered list."
)
_ANSWER = (
    "Split the pipeline into extract parse join aggregate and load stages each writing its output to "
    "object storage so any stage can be retried alone start with a small autoscaling cluster and watch "
    "queue depth stage duration and freshness alerts then compare both outputs daily for one week"
)
_WORDS = _ANSWER.split(" ")
_CREATED = 1_732_250_000
_USAGE = {"prompt_tokens": 212, "completion_tokens": 64, "total_tokens": 276}


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def chat_request(stream: bool, model: str = "tiny") -> bytes:
    """The client request body: ~200 prompt tokens, max_tokens 64, optionally streaming with usage."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a helpful engineering assistant."},
            {"role": "user", "content": _PROMPT},
        ],
        "max_tokens": 64,
        "temperature": 0.7,
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return _dumps(body)


def _completion_words(n: int) -> list[str]:
    return (_WORDS * (n // len(_WORDS) + 1))[:n]


def completion_body(model: str = "tiny") -> bytes:
    """Upstream's fixed non-streaming answer (chat.completion with usage)."""
    return _dumps(
        {
            "id": "chatcmpl-bench0000000000000000000000000001",
            "object": "chat.completion",
            "created": _CREATED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": " ".join(_completion_words(64))},
                    "logprobs": None,
                    "finish_reason": "length",
                }
            ],
            "usage": _USAGE,
        }
    )


def _chunk(delta: dict[str, Any] | None, finish: str | None, usage: bool, model: str) -> bytes:
    event: dict[str, Any] = {
        "id": "chatcmpl-bench0000000000000000000000000002",
        "object": "chat.completion.chunk",
        "created": _CREATED,
        "model": model,
        "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage:
        event["usage"] = _USAGE
    return b"data: " + _dumps(event) + b"\n\n"


def sse_body(n_chunks: int = 64, model: str = "tiny") -> bytes:
    """Upstream's streamed answer: n content chunks, a usage chunk, ``data: [DONE]``."""
    parts = []
    for i, word in enumerate(_completion_words(n_chunks)):
        delta = {"role": "assistant", "content": word} if i == 0 else {"content": " " + word}
        parts.append(_chunk(delta, "length" if i == n_chunks - 1 else None, False, model))
    parts.append(_chunk(None, None, True, model))
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def check_response(mode: str, status: int, body: bytes) -> None:
    """Raise unless ``body`` is a complete answer of ``mode`` (used once per proxy and mode)."""
    if status != 200:
        raise RuntimeError(f"{mode}: status {status}: {body[:300]!r}")
    if mode == "json":
        if json.loads(body).get("usage", {}).get("total_tokens") != _USAGE["total_tokens"]:
            raise RuntimeError(f"json: no usage in {body[:300]!r}")
        return
    events = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
    if len(events) != 66 or events[-1] != b"[DONE]" or b'"usage"' not in events[-2]:
        raise RuntimeError(f"stream: {len(events)} events, tail {body[-200:]!r}")


# ------------------------------------------------------------------------------------------ the proxy


class Forwarder(Protocol):
    """What the proxy needs from an HTTP client library."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def fetch(self, url: str, body: bytes) -> tuple[int, str, bytes]: ...

    async def open_stream(self, url: str, body: bytes) -> tuple[int, str, AsyncIterator[bytes]]: ...


class HttpxForwarder:
    """One shared httpx.AsyncClient, pool and keep-alive sized for ``connections``."""

    def __init__(self, connections: int) -> None:
        self._connections = connections
        self._client: Any = None

    async def start(self) -> None:
        import httpx

        limits = httpx.Limits(
            max_connections=self._connections,
            max_keepalive_connections=self._connections,
            keepalive_expiry=60.0,
        )
        self._client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(30.0), trust_env=False)

    async def close(self) -> None:
        await self._client.aclose()

    async def fetch(self, url: str, body: bytes) -> tuple[int, str, bytes]:
        resp = await self._client.post(url, content=body, headers=_JSON_HEADERS)
        return resp.status_code, resp.headers.get("content-type", "application/json"), resp.content

    async def open_stream(self, url: str, body: bytes) -> tuple[int, str, AsyncIterator[bytes]]:
        request = self._client.build_request("POST", url, content=body, headers=_JSON_HEADERS)
        resp = await self._client.send(request, stream=True)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for piece in resp.aiter_raw():
                    yield piece
            finally:
                await resp.aclose()

        return resp.status_code, resp.headers.get("content-type", "text/event-stream"), relay()


class AiohttpForwarder:
    """One shared aiohttp.ClientSession over a TCPConnector sized for ``connections``."""

    def __init__(self, connections: int) -> None:
        self._connections = connections
        self._session: Any = None

    async def start(self) -> None:
        import aiohttp

        connector = aiohttp.TCPConnector(
            limit=self._connections, limit_per_host=self._connections, keepalive_timeout=60.0
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=30.0), trust_env=False
        )

    async def close(self) -> None:
        await self._session.close()

    async def fetch(self, url: str, body: bytes) -> tuple[int, str, bytes]:
        async with self._session.post(url, data=body, headers=_JSON_HEADERS) as resp:
            data = await resp.read()
            return resp.status, resp.headers.get("Content-Type", "application/json"), data

    async def open_stream(self, url: str, body: bytes) -> tuple[int, str, AsyncIterator[bytes]]:
        resp = await self._session.post(url, data=body, headers=_JSON_HEADERS)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for piece in resp.content.iter_any():
                    yield piece
            finally:
                resp.release()

        return resp.status, resp.headers.get("Content-Type", "text/event-stream"), relay()


class SwitchyardForwarder:
    """The gateway's own backend client (gateway/request/backend_http.py), pool sized for ``connections``."""

    def __init__(self, connections: int) -> None:
        self._connections = connections
        self._client: Any = None

    async def start(self) -> None:
        from gateway.request.backend_http import BackendClient

        self._client = BackendClient(limit_per_backend=self._connections, keepalive=60.0)

    async def close(self) -> None:
        self._client.close()

    def _split(self, url: str) -> tuple[str, str]:
        base, _, path = url.partition(CHAT_PATH)
        return base, CHAT_PATH + path

    async def fetch(self, url: str, body: bytes) -> tuple[int, str, bytes]:
        base, path = self._split(url)
        resp = await self._client.post(base, path, _SWITCHYARD_HEADERS, body, 30.0)
        data = await resp.read()
        resp.release()
        return resp.status, resp.headers.get("content-type", "application/json"), data

    async def open_stream(self, url: str, body: bytes) -> tuple[int, str, AsyncIterator[bytes]]:
        base, path = self._split(url)
        resp = await self._client.post(base, path, _SWITCHYARD_HEADERS, body, 30.0)

        async def relay() -> AsyncIterator[bytes]:
            completed = False
            try:
                while piece := await resp.readany():
                    yield piece
                completed = True
            finally:
                resp.release() if completed else resp.close()

        return resp.status, resp.headers.get("content-type", "text/event-stream"), relay()


_SWITCHYARD_HEADERS = b"Content-Type: application/json\r\n"


def make_forwarder(client: str, connections: int) -> Forwarder:
    if client == "httpx":
        return HttpxForwarder(connections)
    if client == "aiohttp":
        return AiohttpForwarder(connections)
    if client == "switchyard":
        return SwitchyardForwarder(connections)
    raise ValueError(f"unknown client {client!r}")


def create_app() -> Any:
    """Litestar app factory; configured by BENCH_CLIENT, BENCH_CONNECTIONS, BENCH_UPSTREAM_{JSON,STREAM}."""
    from litestar import Litestar, Request, Response, post
    from litestar.response import Stream

    forwarder = make_forwarder(os.environ["BENCH_CLIENT"], int(os.environ["BENCH_CONNECTIONS"]))
    json_url = os.environ["BENCH_UPSTREAM_JSON"] + CHAT_PATH
    stream_url = os.environ["BENCH_UPSTREAM_STREAM"] + CHAT_PATH

    names = {"Request": Request, "Response": Response, "Any": Any}

    @post(CHAT_PATH, status_code=200, signature_namespace=names)
    async def chat(request: Request[Any, Any, Any]) -> Response[Any]:
        body = await request.body()
        if STREAM_MARK in body:
            status, ctype, pieces = await forwarder.open_stream(stream_url, body)
            return Stream(pieces, status_code=status, media_type=ctype)
        status, ctype, data = await forwarder.fetch(json_url, body)
        return Response(data, status_code=status, media_type=ctype)

    return Litestar(
        route_handlers=[chat],
        on_startup=[forwarder.start],
        on_shutdown=[forwarder.close],
        openapi_config=None,
        logging_config=None,
    )


def _serve_uvicorn(port: int) -> None:
    import uvicorn

    uvicorn.run(
        f"{MODULE}:create_app",
        factory=True,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        workers=1,
        access_log=False,
        log_level="warning",
        lifespan="on",
    )


def proxy_argv(server: str, port: int) -> list[str]:
    if server == "uvicorn":
        return python_argv(MODULE, "_proxy", str(port))
    if server == "granian":
        return python_argv(
            "granian",
            *("--interface", "asgi", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
            *("--runtime-mode", "st", "--loop", "uvloop", "--no-ws", "--no-access-log"),
            *("--log-level", "warning", "--factory", f"{MODULE}:create_app"),
        )
    raise ValueError(f"unknown server {server!r}")


# ---------------------------------------------------------------------------------------- upstreams


@dataclass
class Upstream:
    kind: str
    json_base: str
    stream_base: str
    child: Child


def _nginx_conf(prefix: Path, json_port: int, stream_port: int) -> str:
    """Static answers for POST: ``return 405`` + ``error_page 405 =200 /file`` (redirects as GET)."""

    def server(port: int, name: str, ctype: str) -> str:
        return f"""
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        root {prefix}/www;
        location = {CHAT_PATH} {{ error_page 405 =200 /{name}; return 405; }}
        location = /{name} {{ internal; default_type {ctype}; add_header Cache-Control no-cache; }}
        location = /health {{ return 200; }}
        location / {{ return 404; }}
    }}"""

    kinds = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    temp_paths = "\n".join(f"    {kind}_temp_path {prefix}/tmp/{kind};" for kind in kinds)
    return f"""worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 8192; multi_accept on; }}
http {{
    access_log off;
    server_tokens off;
    etag off;
    sendfile on;
    tcp_nodelay on;
    keepalive_timeout 300s;
    keepalive_requests 10000000;
    open_file_cache max=16 inactive=3600s;
    open_file_cache_valid 3600s;
    client_body_buffer_size 64k;
{temp_paths}
{server(json_port, "completion.json", "application/json")}
{server(stream_port, "stream.sse", "text/event-stream")}
}}
"""


def _write_nginx_prefix(prefix: Path, json_port: int, stream_port: int) -> Path:
    (prefix / "www").mkdir(parents=True, exist_ok=True)
    (prefix / "tmp").mkdir(exist_ok=True)
    (prefix / "www" / "completion.json").write_bytes(completion_body())
    (prefix / "www" / "stream.sse").write_bytes(sse_body())
    for path in (prefix.parent, prefix, prefix / "www", *(prefix / "www").iterdir()):
        path.chmod(0o755)  # nginx workers may run as an unprivileged user (e.g. nobody)
    conf = prefix / "nginx.conf"
    conf.write_text(_nginx_conf(prefix, json_port, stream_port))
    return conf


def start_upstream(group: ProcessGroup, kind: str, cpu: int, workdir: Path) -> Upstream:
    json_port, stream_port = free_port(), free_port()
    if kind == "nginx":
        nginx = which("nginx", "/usr/sbin", "/usr/local/sbin")
        if nginx is None:
            raise RuntimeError("nginx not found")
        prefix = workdir / "nginx"
        conf = _write_nginx_prefix(prefix, json_port, stream_port)
        child = group.start("upstream-nginx", [nginx, "-p", str(prefix), "-c", str(conf)], cpu=cpu)
    else:
        argv = python_argv(MODULE, "_upstream", str(json_port), str(stream_port))
        child = group.start("upstream-aiohttp", argv, cpu=cpu)
    upstream = Upstream(kind, f"http://127.0.0.1:{json_port}", f"http://127.0.0.1:{stream_port}", child)
    for mode, base in (("json", upstream.json_base), ("stream", upstream.stream_base)):
        url = base + CHAT_PATH
        body = chat_request(mode == "stream")
        wait_until(lambda u=url, b=body: http_post(u, b)[0] == 200, timeout=15, what=kind, child=child)
        check_response(mode, *http_post(url, body))
    return upstream


def _serve_aiohttp_upstream(json_port: int, stream_port: int) -> None:
    from aiohttp import web

    completion, sse = completion_body(), sse_body()

    async def answer_json(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=completion, content_type="application/json")

    async def answer_stream(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=sse, content_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def serve() -> None:
        runners = []  # keep references until the process is stopped
        for port, handler in ((json_port, answer_json), (stream_port, answer_stream)):
            app = web.Application()
            app.router.add_post(CHAT_PATH, handler)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
            runners.append(runner)
        await asyncio.Event().wait()  # until the process group is signalled

    _run_async(serve())


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
                async with session.post(url, data=body, headers=_JSON_HEADERS) as resp:
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


def _run_loadgen(url: str, mode: str, connections: int, seconds: float) -> None:
    assert_loopback(url)
    result = _run_async(_closed_loop(url, chat_request(mode == "stream"), connections, seconds))
    print(RESULT_MARK + json.dumps(result), flush=True)


def _run_async(coro: Any) -> Any:
    with contextlib.suppress(ImportError):
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


# -------------------------------------------------------------------------------------- orchestration


@dataclass
class Config:
    duration: float = 10.0
    warmup: float = 3.0
    connections: int = 64
    server: str = "uvicorn"
    clients: tuple[str, ...] = CLIENTS
    modes: tuple[str, ...] = MODES
    reps: int = 1
    upstream: str = "auto"
    loadgen: str = "auto"


@dataclass
class Phase:
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_req: float
    proxy_cpu_pct: float
    requests: int
    errors: int


@dataclass
class Setup:
    group: ProcessGroup
    workdir: Path
    upstream: Upstream
    load: LoadGen
    proxy_cpu: int


def resolve_tools(config: Config) -> tuple[str, str]:
    """(upstream kind, load generator kind) after applying the ``auto`` choices."""
    upstream = config.upstream
    if upstream == "auto":
        upstream = "nginx" if which("nginx", "/usr/sbin", "/usr/local/sbin") else "aiohttp"
    loadgen = config.loadgen
    if loadgen == "auto":
        loadgen = "wrk" if which("wrk") else "aiohttp"
    return upstream, loadgen


def start_proxy(setup: Setup, config: Config, client: str) -> tuple[Child, str]:
    port = free_port()
    env = dict(
        os.environ,
        BENCH_CLIENT=client,
        BENCH_CONNECTIONS=str(config.connections),
        BENCH_UPSTREAM_JSON=setup.upstream.json_base,
        BENCH_UPSTREAM_STREAM=setup.upstream.stream_base,
        PYTHONUNBUFFERED="1",
    )
    cwd = str(Path(__file__).resolve().parent.parent)
    argv = proxy_argv(config.server, port)
    child = setup.group.start(f"proxy-{client}", argv, cpu=setup.proxy_cpu, env=env, cwd=cwd)
    url = f"http://127.0.0.1:{port}{CHAT_PATH}"
    body = chat_request(False)
    wait_until(lambda: http_post(url, body)[0] == 200, timeout=30, what=f"proxy-{client}", child=child)
    return child, url


def measure(setup: Setup, config: Config, proxy: Child, url: str, mode: str) -> Phase:
    check_response(mode, *http_post(url, chat_request(mode == "stream")))
    if config.warmup > 0:
        setup.load.run(setup.group, url, mode, config.warmup)
        time.sleep(0.3)  # let in-flight work drain before the measured phase
    cpu_before = session_cpu_seconds(proxy.pid)
    wall_before = time.perf_counter()
    result = setup.load.run(setup.group, url, mode, config.duration)
    cpu = session_cpu_seconds(proxy.pid) - cpu_before
    wall = time.perf_counter() - wall_before
    if not proxy.alive():
        raise RuntimeError(f"proxy died during {mode}:\n{proxy.log_tail()}")
    ok = max(result.requests - result.errors, 1)
    time.sleep(0.3)
    return Phase(
        rps=result.requests / result.duration_s if result.duration_s else 0.0,
        p50_ms=result.p50_ms,
        p99_ms=result.p99_ms,
        cpu_us_per_req=cpu * 1e6 / ok,
        proxy_cpu_pct=100.0 * cpu / wall,
        requests=result.requests,
        errors=result.errors,
    )


def run_client(setup: Setup, config: Config, client: str) -> dict[str, Phase]:
    proxy, url = start_proxy(setup, config, client)
    try:
        phases = {}
        for mode in config.modes:
            phases[mode] = measure(setup, config, proxy, url, mode)
            _log(f"  {client:8} {mode:7} {_fmt_phase(phases[mode])}")
        return phases
    finally:
        setup.group.stop(proxy)


def _median_phase(phases: list[Phase]) -> Phase:
    fields = asdict(phases[0]).keys()
    merged = {name: statistics.median(getattr(p, name) for p in phases) for name in fields}
    merged["requests"] = int(sum(p.requests for p in phases))
    merged["errors"] = int(sum(p.errors for p in phases))
    return Phase(**merged)


def run_benchmark(config: Config) -> dict[str, Any]:
    """Run every client x mode (``reps`` alternating rounds) and return the result dict."""
    upstream_kind, loadgen_kind = resolve_tools(config)
    proxy_cpu, load_cpu = pick_cpus()
    with tempfile.TemporaryDirectory(prefix="bench-clients-") as tmp:
        workdir = Path(tmp)
        group = ProcessGroup(workdir)
        try:
            upstream = start_upstream(group, upstream_kind, load_cpu, workdir)
            load = LoadGen(loadgen_kind, load_cpu, workdir, config.connections)
            setup = Setup(group, workdir, upstream, load, proxy_cpu)
            _log(_describe(config, upstream_kind, loadgen_kind, proxy_cpu, load_cpu))
            runs: dict[str, dict[str, list[Phase]]] = {
                c: {m: [] for m in config.modes} for c in config.clients
            }
            for rep in range(config.reps):
                order = config.clients if rep % 2 == 0 else tuple(reversed(config.clients))
                for client in order:
                    for mode, phase in run_client(setup, config, client).items():
                        runs[client][mode].append(phase)
        finally:
            group.close()
    return _summarise(config, runs, upstream_kind, loadgen_kind, proxy_cpu, load_cpu)


def _summarise(
    config: Config,
    runs: dict[str, dict[str, list[Phase]]],
    upstream: str,
    loadgen: str,
    proxy_cpu: int,
    load_cpu: int,
) -> dict[str, Any]:
    results = {c: {m: asdict(_median_phase(p)) for m, p in modes.items()} for c, modes in runs.items()}
    ratios: dict[str, dict[str, dict[str, float]]] = {}
    if "httpx" in results:
        for client in results:
            if client == "httpx":
                continue
            ratios[client] = {}
            for mode in config.modes:
                base, other = results["httpx"][mode], results[client][mode]
                ratios[client][mode] = {
                    key: (other[key] / base[key]) if base[key] else float("nan")
                    for key in ("rps", "p50_ms", "p99_ms", "cpu_us_per_req")
                }
    return {
        "config": asdict(config),
        "environment": {
            "server": config.server,
            "upstream": upstream,
            "loadgen": loadgen,
            "proxy_cpu": proxy_cpu,
            "load_cpu": load_cpu,
            "python": sys.version.split()[0],
        },
        "results": results,
        "ratios_over_httpx": ratios,
        "all_reps": {c: {m: [asdict(p) for p in ps] for m, ps in modes.items()} for c, modes in runs.items()},
    }


# ------------------------------------------------------------------------------------------ reporting


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _fmt_phase(p: Phase) -> str:
    return (
        f"{p.rps:9.0f} req/s  p50 {p.p50_ms:7.2f} ms  p99 {p.p99_ms:7.2f} ms  "
        f"{p.cpu_us_per_req:7.0f} CPU us/req  ({p.proxy_cpu_pct:.0f}% CPU, {p.errors} errors)"
    )


def _describe(config: Config, upstream: str, loadgen: str, proxy_cpu: int, load_cpu: int) -> str:
    return (
        f"bench_http_clients: server={config.server} upstream={upstream} loadgen={loadgen} "
        f"proxy on CPU {proxy_cpu}, upstream+load on CPU {load_cpu}; {config.connections} connections, "
        f"warm-up {config.warmup:g}s, measured {config.duration:g}s, reps {config.reps}"
    )


def format_table(report: dict[str, Any]) -> str:
    env = report["environment"]
    cfg = report["config"]
    head = (
        f"{'mode':7} {'client':16} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'CPU us/req':>11} {'proxy CPU%':>10} {'errors':>7}"
    )
    lines = [
        f"server={env['server']} upstream={env['upstream']} loadgen={env['loadgen']} "
        f"connections={cfg['connections']} duration={cfg['duration']:g}s reps={cfg['reps']} "
        f"(proxy CPU {env['proxy_cpu']}, upstream+load CPU {env['load_cpu']})",
        head,
        "-" * len(head),
    ]
    for mode in cfg["modes"]:
        for client in cfg["clients"]:
            r = report["results"][client][mode]
            lines.append(
                f"{mode:7} {client:16} {r['rps']:9.0f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
                f"{r['cpu_us_per_req']:11.0f} {r['proxy_cpu_pct']:10.0f} {r['errors']:7d}"
            )
        for client, by_mode in report["ratios_over_httpx"].items():
            ratio = by_mode.get(mode)
            if ratio:
                lines.append(
                    f"{mode:7} {client + '/httpx':16} {ratio['rps']:9.2f} {ratio['p50_ms']:8.2f} "
                    f"{ratio['p99_ms']:8.2f} {ratio['cpu_us_per_req']:11.2f}"
                )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- CLI


def _csv(choices: Sequence[str]) -> Any:
    def parse(text: str) -> tuple[str, ...]:
        items = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"choose from {','.join(choices)}")
        return items

    return parse


def parse_args(argv: Sequence[str] | None) -> tuple[Config, Path | None]:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per client x mode")
    p.add_argument("--warmup", type=float, default=3.0, help="discarded warm-up seconds (0 = none)")
    p.add_argument("--connections", type=int, default=64, help="concurrent client connections")
    p.add_argument("--server", choices=("uvicorn", "granian"), default="uvicorn")
    p.add_argument("--clients", type=_csv(CLIENTS), default=CLIENTS, help="default: httpx,aiohttp,switchyard")
    p.add_argument("--modes", type=_csv(MODES), default=MODES, help="default: json,stream")
    p.add_argument("--reps", type=int, default=1, help="alternating rounds; the table shows medians")
    p.add_argument("--upstream", choices=("auto", "nginx", "aiohttp"), default="auto")
    p.add_argument("--loadgen", choices=("auto", "wrk", "aiohttp"), default="auto")
    p.add_argument("--json", type=Path, default=None, help="also write the full result dict here")
    a = p.parse_args(argv)
    if a.duration <= 0 or a.duration > 600 or a.connections < 1 or a.connections > 4096 or a.reps < 1:
        p.error("need 0 < duration <= 600, 1 <= connections <= 4096, reps >= 1")
    warmup = min(max(a.warmup, 0.0), 120.0)
    config = Config(
        a.duration, warmup, a.connections, a.server, a.clients, a.modes, a.reps, a.upstream, a.loadgen
    )
    return config, a.json


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "_proxy":
        _serve_uvicorn(int(args[1]))
        return 0
    if args and args[0] == "_upstream":
        _serve_aiohttp_upstream(int(args[1]), int(args[2]))
        return 0
    if args and args[0] == "_loadgen":
        _run_loadgen(args[1], args[2], int(args[3]), float(args[4]))
        return 0
    config, json_path = parse_args(args)
    install_interrupt_handlers()
    try:
        report = run_benchmark(config)
    except KeyboardInterrupt:
        _log("interrupted; all child processes stopped")
        return 130
    print(format_table(report))
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        _log(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
