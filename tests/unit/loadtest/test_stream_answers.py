"""The per-chunk benches' check of one relayed answer, against canned answers over a real socket."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from loadtest.bench import stream_answers, stream_upstream


def _chunked(payload: bytes, piece: int = 100) -> bytes:
    framed = b"".join(
        b"%x\r\n%b\r\n" % (len(payload[i : i + piece]), payload[i : i + piece])
        for i in range(0, len(payload), piece)
    )
    return framed + b"0\r\n\r\n"


def _stream(tokens: int) -> bytes:
    events = [b'data: {"choices":[{"delta":{"content":"x"}}]}' for _ in range(tokens)]
    events.append(b"data: " + json.dumps({"choices": [], "usage": {"completion_tokens": tokens}}).encode())
    events.append(b"data: [DONE]")
    return b"".join(event + b"\n\n" for event in events)


@contextmanager
def _answering(answer: bytes) -> Iterator[str]:
    """A one-connection server that reads the request, then writes `answer` and closes."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        thread.join(5)
        server.close()


def test_a_whole_stream_passes_and_its_size_on_the_wire_is_returned() -> None:
    answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + _chunked(
        _stream(stream_upstream.TOKENS)
    )
    with _answering(answer) as url:
        assert stream_answers.check_stream(url, "key", "burst") == len(answer)


def test_a_stream_missing_a_token_is_refused() -> None:
    answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + _chunked(
        _stream(stream_upstream.TOKENS - 1)
    )
    with _answering(answer) as url, pytest.raises(RuntimeError):
        stream_answers.check_stream(url, "key", "paced")


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked as the backend framed it"])
def test_a_whole_answer_passes_with_either_framing(chunked: bool) -> None:
    body = json.dumps({"usage": {"completion_tokens": stream_upstream.TOKENS}}).encode()
    head = b"HTTP/1.1 200 OK\r\n"
    answer = (
        head + b"transfer-encoding: chunked\r\n\r\n" + _chunked(body, 7)
        if chunked
        else head + b"content-length: %d\r\n\r\n%b" % (len(body), body)
    )
    with _answering(answer) as url:
        assert stream_answers.check_stream(url, "key", "json") == len(answer)


def test_an_error_answer_is_refused_with_what_it_said() -> None:
    answer = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 2\r\n\r\n{}"
    with _answering(answer) as url, pytest.raises(RuntimeError, match="429"):
        stream_answers.check_stream(url, "key", "json")
