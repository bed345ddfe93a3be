"""The balancer's config (gateway.cli.cluster.haproxy_config) re-sends a request that a replica took and then
dropped without an answer, the way a replica does when it is killed or closes its listener while requests
wait in its accept backlog, even when the request is not the first on the client's keep-alive connection
and its body arrived after its headers (httpx, and so the OpenAI SDK, write them separately).

Without `option http-buffer-request` HAProxy forwards such a request's headers before its body is in, keeps
no copy to retry with, and closes the client's connection with no answer: this test then fails.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.lifetime import stop_process
from gateway.cli.cluster import balancer_socket, haproxy_config, start_haproxy
from gateway.http.proxy_protocol import read_header

BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hello"}]}'


def _read_request(stream: socket.socket) -> tuple[bytes, bytes] | None:
    """One HTTP/1.1 request off `stream`: (request line, body); None when the peer closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = stream.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = stream.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head.split(b"\r\n", 1)[0], body


def _read_proxy_header(stream: socket.socket) -> None:
    """The PROXY v2 header HAProxy begins each connection with (send-proxy-v2), read exactly."""
    head = stream.recv(16, socket.MSG_WAITALL)
    length = int.from_bytes(head[14:16], "big") if len(head) == 16 else 0
    header = read_header(head + (stream.recv(length, socket.MSG_WAITALL) if length else b""))
    assert header is not None and header.length == 16 + length, head


def _answer(stream: socket.socket, text: bytes) -> None:
    stream.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(text), text))


class Replica(socketserver.ThreadingTCPServer):
    """Answers `GET /ready`; a POST is answered (`drop=None`) or dropped unanswered once read: closed
    (`"close"`, as a killed process's socket is) or reset (`"reset"`, as an un-accepted connection is)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, drop: str | None) -> None:
        self.drop = drop
        self.posts = 0
        super().__init__(("127.0.0.1", 0), _ReplicaHandler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _ReplicaHandler(socketserver.BaseRequestHandler):
    server: Replica

    def handle(self) -> None:
        with contextlib.suppress(OSError):  # the balancer closed the connection
            self._serve(self.request)

    def _serve(self, stream: socket.socket) -> None:
        _read_proxy_header(stream)
        while (request := _read_request(stream)) is not None:
            line, _ = request
            if not line.startswith(b"POST"):
                _answer(stream, b"ready")
                continue
            self.server.posts += 1
            if self.server.drop is None:
                _answer(stream, b"answered")
                continue
            if self.server.drop == "reset":
                stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            stream.close()
            return


def _haproxy_answers(port: int) -> bool:
    """HAProxy itself answers on `port` (the listening socket exists before it does): `/admin/` is its 403."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as client:
            client.sendall(b"GET /admin/ HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")
            return client.recv(64).startswith(b"HTTP/1.1 403")
    except OSError:
        return False


@pytest.fixture(params=["close", "reset"])
def balancer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[int, Replica, Replica]]:
    haproxy = shutil.which("haproxy")
    assert haproxy is not None, "make test-cluster installs haproxy"
    dropping, answering = Replica(request.param), Replica(None)
    for replica in (dropping, answering):
        threading.Thread(target=replica.serve_forever, daemon=True).start()
    listener = balancer_socket()
    port = listener.getsockname()[1]
    config = tmp_path / "haproxy.cfg"
    config.write_text(haproxy_config(listener.fileno(), [dropping.port, answering.port]))
    log = tmp_path / "balancer.log"
    process = start_haproxy(config, listener, log)
    try:
        deadline = time.monotonic() + 10
        while not _haproxy_answers(port):
            assert process.poll() is None, f"haproxy exited: {log.read_text()}"
            assert time.monotonic() < deadline, "haproxy did not start"
            time.sleep(0.05)
        yield port, dropping, answering
    finally:
        stop_process(process)
        for replica in (dropping, answering):
            replica.shutdown()
            replica.server_close()


def _response(client: socket.socket) -> bytes:
    """The next response's status line and body, or b"" when the balancer closed the connection instead."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = client.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(v)
            for n, _, v in (h.partition(b":") for h in head.split(b"\r\n")[1:])
            if n.lower() == b"content-length"
        ),
        0,
    )
    while len(body) < length:
        body += client.recv(65536)
    return head.split(b"\r\n", 1)[0] + b" " + body


def test_a_request_a_replica_dropped_unanswered_is_answered_by_another(
    balancer: tuple[int, Replica, Replica],
) -> None:
    port, dropping, answering = balancer
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(BODY)
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(b"GET /ready HTTP/1.1\r\nHost: gateway\r\n\r\n")
        assert _response(client).startswith(b"HTTP/1.1 200")  # later requests are not the connection's first
        answers = []
        for _ in range(6):  # leastconn between two idle servers alternates: about half go to `dropping` first
            try:
                client.sendall(head)
                time.sleep(0.05)  # the body after the headers, as httpx sends it, only later
                client.sendall(BODY)
                answers.append(_response(client))
            except OSError as exc:
                answers.append(f"the balancer closed the connection: {exc!r}".encode())
            if not answers[-1].startswith(b"HTTP/1.1 200"):
                break
    assert dropping.posts > 0, "no request reached the replica that drops them"
    assert answers == [b"HTTP/1.1 200 OK answered"] * 6, answers
    assert answering.posts == 6
