"""The upstream the proxy forwards to: nginx with static bodies when installed, else a small aiohttp app."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from loadtest.bench._util import (
    http_post,
    python_argv,
    which,
)
from loadtest.bench.http_clients.loadgen import run_async
from loadtest.bench.http_clients.payloads import (
    CHAT_PATH,
    MODULE,
    chat_request,
    check_response,
    completion_body,
    sse_body,
)
from loadtest.processes import Child, ProcessGroup, free_port, wait_until

# ---------------------------------------------------------------------------------------- upstreams


@dataclass
class Upstream:
    kind: str
    json_base: str
    stream_base: str
    child: Child


def _nginx_conf(prefix: Path, json_port: int, stream_port: int) -> str:
    """Static answers for POST: ``return 405`` + ``error_page 405 =200 /file`` (redirects as GET).

    ``master_process off``: nginx is one process, which dies with the bench however the bench ends (the
    process group's death signal reaches its child only; a master's worker outlived a SIGKILLed master)."""

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
    return f"""master_process off;
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
        wait_until(partial(_answers_ok, url, body), timeout=15, what=kind, child=child)
        check_response(mode, *http_post(url, body))
    return upstream


def _answers_ok(url: str, body: bytes) -> bool:
    return http_post(url, body)[0] == 200


def serve_aiohttp_upstream(json_port: int, stream_port: int) -> None:
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

    run_async(serve())
