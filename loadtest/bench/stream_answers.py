"""What the per-chunk benches ask for and what a relayed answer must be.

The request for each upstream shape (loadtest/bench/stream_upstream.py: `burst`, `paced`, `json`), wrk's
script sending it, and the check of one relayed answer: every token's event, the usage chunk and `[DONE]`
for a stream, the usage for a whole answer, whether the relay kept the backend's chunked framing or not.
The answer's size in tokens is `stream_upstream.TOKENS`, read when called (`--tokens` changes it).
"""

from __future__ import annotations

import json
import socket

from loadtest.bench import stream_upstream
from loadtest.bench.stream_upstream import MODEL


def request_body(shape: str) -> bytes:
    body = {
        "model": f"{MODEL}-{shape}",
        "messages": [{"role": "user", "content": "Tell me a long story about request routing. " * 20}],
        "max_tokens": stream_upstream.TOKENS,
    }
    if shape != "json":
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def wrk_script(key: str, shape: str) -> str:
    return (
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(request_body(shape).decode())}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {key}"\n'
        'function done(summary, latency, requests) io.write("BYTES " .. summary.bytes .. "\\n") end\n'
    )


def _dechunk(body: bytes) -> bytes:
    out: list[bytes] = []
    at = 0
    while True:
        line_end = body.index(b"\r\n", at)
        size = int(body[at:line_end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(body[line_end + 2 : line_end + 2 + size])
        at = line_end + 4 + size


def _whole(raw: bytes) -> bool:
    head, found, body = raw.partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return raw.endswith(b"\r\n0\r\n\r\n")


def check_stream(url: str, key: str, shape: str) -> int:
    """Validate one relayed answer (every token event, the usage chunk, [DONE]); its size on the wire."""
    host, port = url.removeprefix("http://").split(":")
    body = request_body(shape)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    raw = b""
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode() + body)
        while not _whole(raw):
            data = sock.recv(65536)
            if not data:
                break
            raw += data
    headers, _, chunked = raw.partition(b"\r\n\r\n")
    if not headers.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"{url} answered {raw[:300]!r}")
    if shape == "json":
        if b"\r\ntransfer-encoding: chunked" in headers.lower():  # relayed as the backend framed it
            chunked = _dechunk(chunked)
        if json.loads(chunked)["usage"]["completion_tokens"] != stream_upstream.TOKENS:
            raise RuntimeError(f"{url} answered without the usage")
        return len(raw)
    events = [e for e in _dechunk(chunked).split(b"\n\n") if e]
    usage = json.loads(events[-2][6:])
    if (
        usage["usage"]["completion_tokens"] != stream_upstream.TOKENS
        or events[-1] != b"data: [DONE]"
        or len(events) != stream_upstream.TOKENS + 2
    ):
        raise RuntimeError(f"{url} relayed an unexpected stream ({len(events)} events)")
    return len(raw)
