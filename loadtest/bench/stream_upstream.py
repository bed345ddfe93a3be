"""The stand-in for vLLM that loadtest/bench/stream_chunks.py streams from: nginx with its echo module,
writing each answer as vLLM's server shapes it (a role chunk, one `chat.completion.chunk` per token, the
usage chunk, `data: [DONE]`), in bursts or paced, and the same answer not streamed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loadtest.bench._util import http_post, which
from loadtest.processes import ProcessGroup, free_port, wait_until

MODEL = "tiny-stream"
TOKENS = 512
PROMPT_TOKENS = 212
ECHO_MODULE = Path("/usr/lib/nginx/modules/ngx_http_echo_module.so")


def sse_events(tokens: int | None = None) -> list[bytes]:
    """A vLLM-shaped chat stream: one event per token (the first carries the role), usage, [DONE]."""
    tokens = TOKENS if tokens is None else tokens
    sid, created = "chatcmpl-0a1b2c3d4e5f40718293a4b5c6d7e8f9", 1732250000
    head = {"id": sid, "object": "chat.completion.chunk", "created": created, "model": MODEL}
    events = []
    for i in range(tokens):
        delta: dict[str, Any] = {"content": f" word{i}"}
        if i == 0:
            delta = {"role": "assistant", "content": "word0"}
        last = i == tokens - 1
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": "length" if last else None}
        events.append({**head, "choices": [choice]})
    usage = {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": tokens,
        "total_tokens": PROMPT_TOKENS + tokens,
    }
    events.append({**head, "choices": [], "usage": usage})
    lines = [b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n" for e in events]
    return [*lines, b"data: [DONE]\n\n"]


def _ngx(text: bytes) -> str:
    s = text.decode()
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def _completion() -> bytes:
    text = " ".join(f"word{i}" for i in range(TOKENS))
    usage = {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": TOKENS,
        "total_tokens": PROMPT_TOKENS + TOKENS,
    }
    answer = {
        "id": "chatcmpl-9f1c2d3e4b5a4c6d8e7f0a1b2c3d4e5f",
        "object": "chat.completion",
        "created": 1732250000,
        "model": f"{MODEL}-json",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
        ],
        "usage": usage,
    }
    return json.dumps(answer, separators=(",", ":")).encode()


def _echo_body(shape: str, paced_ms: float) -> str:
    if shape == "json":
        answer = _completion()  # in pieces: nginx refuses a parameter past ~4 KB
        return "\n".join(f"echo -n {_ngx(answer[i : i + 3000])};" for i in range(0, len(answer), 3000))
    events = sse_events()
    if shape == "paced":
        sleep = f"echo_sleep {paced_ms / 1000:.3f};"
        return "\n".join(f"echo -n {_ngx(e)}; echo_flush; {sleep}" for e in events)
    groups, current = [], b""
    for event in events:
        if current and len(current) + len(event) > 3500:
            groups.append(current)
            current = b""
        current += event
    groups.append(current)
    return "\n".join(f"echo -n {_ngx(g)};" for g in groups)


def start_nginx(group: ProcessGroup, work: Path, cpu: int, paced_ms: float) -> dict[str, str]:
    """nginx streaming the answer on one port per shape; {shape: base URL}."""
    nginx = which("nginx", "/usr/sbin", "/usr/local/sbin")
    if nginx is None or not ECHO_MODULE.exists():
        raise SystemExit(
            "needs nginx and its echo module (apt-get install nginx-light libnginx-mod-http-echo)"
        )
    prefix = work / "nginx"
    (prefix / "tmp").mkdir(parents=True, exist_ok=True)
    ports = {shape: free_port() for shape in ("burst", "paced", "json")}
    servers = "".join(
        f"""
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location = /v1/chat/completions {{
            default_type {"application/json" if shape == "json" else "text/event-stream"};
            echo_read_request_body;
            {_echo_body(shape, paced_ms)}
        }}
        location = /health {{ return 200; }}
        location / {{ return 404; }}
    }}"""
        for shape, port in ports.items()
    )
    temp = "\n".join(
        f"    {k}_temp_path {prefix}/tmp/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    conf = prefix / "nginx.conf"  # one process (`master_process off`), as http_clients/upstream.py says why
    conf.write_text(
        f"""load_module {ECHO_MODULE};
master_process off;
daemon off;
pid {prefix}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 8192; multi_accept on; }}
http {{
    access_log off;
    keepalive_timeout 300s;
    keepalive_requests 10000000;
{temp}
{servers}
}}
"""
    )
    child = group.start("nginx", [nginx, "-p", str(prefix), "-c", str(conf)], cpu=cpu)
    urls = {shape: f"http://127.0.0.1:{port}" for shape, port in ports.items()}
    for url in urls.values():

        def answers(u: str = url) -> bool:
            return http_post(u + "/v1/chat/completions", b"{}")[0] == 200

        wait_until(
            answers,
            timeout=15,
            what="nginx",
            child=child,
        )
    return urls
