"""A raw-socket corpus over every POST endpoint: framing, encodings, nesting, sizes and upgrades.

Each entry must get an answer: a 2xx, or an error in OpenAI's shape that is not a 5xx; a refused request
changes no ledger total, and at the end no breaker is open and the gateway's memory is back near where it
started.
"""

from __future__ import annotations

import json

import pytest

from tests.fuzz.conftest import (
    ENDPOINTS,
    MAX_BODY_BYTES,
    MODEL,
    FuzzGateway,
    assert_openai_error,
    raw_exchange,
)

VALID = {
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 2,
    },
    "/v1/completions": {"model": MODEL, "prompt": "hello", "max_tokens": 2},
    "/v1/embeddings": {"model": MODEL, "input": "hello"},
    "/v1/responses": {"model": MODEL, "input": "hello", "max_output_tokens": 2},
    "/admin/v1/explain": {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]},
}


def _request(
    path: str, body: bytes, headers: bytes = b"", method: bytes = b"POST", length: bool = True
) -> bytes:
    head = method + b" " + path.encode() + b" HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
    if length:
        head += b"Content-Length: %d\r\n" % len(body)
    return head + headers + b"\r\n" + body


def _with(path: str, text: bytes) -> bytes:
    """The valid body with `text` spliced in as the value of an extra field and of the main text field."""
    valid = json.dumps(VALID[path]).encode()
    return valid[:-1] + b', "extra": ' + text + b"}"


def corpus(path: str) -> list[tuple[str, bytes]]:
    valid = json.dumps(VALID[path]).encode()
    text_at = valid.index(b'"hello"')
    bad_text = [
        b'"hel\xfflo"',
        b'"\xc3"',
        b'"\xed\xa0\x80"',  # an encoded surrogate
        b'"\xf4\x90\x80\x80"',  # past U+10FFFF
        b'"\xc0\xaf"',  # overlong
        b'"\\ud800"',  # a lone surrogate escape: valid JSON text
        b'"nul\x00byte"',
    ]
    entries: list[tuple[str, bytes]] = []
    for i, text in enumerate(bad_text):
        entries.append((f"text-{i}", _request(path, valid[:text_at] + text + valid[text_at + 7 :])))
        entries.append((f"extra-{i}", _request(path, _with(path, text))))
    entries += [
        ("model-bytes", _request(path, valid.replace(MODEL.encode(), b"ll\xffama"))),
        ("bom", _request(path, b"\xef\xbb\xbf" + valid)),
        ("utf16", _request(path, valid.decode().encode("utf-16"))),
        ("latin1-header", _request(path, valid, headers=b"X-Switchyard-Tenant: caf\xe9\r\n")),
        ("nested-1000", _request(path, _with(path, b"[" * 1000 + b"]" * 1000))),
        ("nested-100k", _request(path, _with(path, b"[" * 100_000 + b"]" * 100_000))),
        ("nested-objects", _request(path, _with(path, b'{"a":' * 2000 + b"1" + b"}" * 2000))),
        ("nested-main", _request(path, valid.replace(b'"hello"', b"[" * 3000 + b"]" * 3000))),
        ("big-int", _request(path, _with(path, b"9" * 5000))),
        ("n-int64", _request(path, valid[:-1] + b', "n": 9223372036854775808, "max_tokens": 1}')),
        ("float-exp", _request(path, _with(path, b"1e999999"))),
        ("empty", _request(path, b"")),
        ("not-object", _request(path, b"[" + valid + b"]")),
        ("truncated", _request(path, valid[:-3])),
        ("trailing", _request(path, valid + b" garbage")),
        ("two-docs", _request(path, valid + valid)),
        ("main-wrong-type", _request(path, valid.replace(b'"hello"', b"{}"))),
        ("over-max-body", _request(path, _with(path, b'"' + b"x" * (MAX_BODY_BYTES + 10) + b'"'))),
        (
            "claims-huge-length",
            _request(path, valid, length=False, headers=b"Content-Length: 99999999999\r\n"),
        ),
        ("length-too-short", _request(path, valid, length=False, headers=b"Content-Length: 5\r\n")),
        ("negative-length", _request(path, valid, length=False, headers=b"Content-Length: -1\r\n")),
        ("two-lengths", _request(path, valid, headers=b"Content-Length: 3\r\n")),
        ("te-and-cl", _request(path, b"0\r\n\r\n", headers=b"Transfer-Encoding: chunked\r\n")),
        (
            "chunked",
            _request(
                path,
                b"%x\r\n%s\r\n0\r\n\r\n" % (len(valid), valid),
                length=False,
                headers=b"Transfer-Encoding: chunked\r\n",
            ),
        ),
        (
            "chunked-garbage",
            _request(path, b"zz\r\nxx\r\n", length=False, headers=b"Transfer-Encoding: chunked\r\n"),
        ),
        ("bad-method", _request(path, valid, method=b"BREW")),
        ("get", _request(path, b"", method=b"GET")),
        ("http10", _request(path, valid).replace(b"HTTP/1.1", b"HTTP/1.0", 1)),
        ("http2-preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        ("garbage", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256))),
        ("bad-header-name", _request(path, valid, headers=b"Bad Header: x\r\n")),
        ("header-ctl", _request(path, valid, headers=b"X-A: a\x01b\r\n")),
        ("long-url", _request(path + "?" + "q" * 70_000, valid)),
        ("huge-header", _request(path, valid, headers=b"X-Request-Id: " + b"r" * 1_000_000 + b"\r\n")),
        ("many-headers", _request(path, valid, headers=b"".join(b"X-H%d: v\r\n" % i for i in range(5000)))),
        ("bad-traceparent", _request(path, valid, headers=b"Traceparent: " + b"f" * 100_000 + b"\r\n")),
        ("ws-upgrade", _request(path, valid, headers=b"Connection: Upgrade\r\nUpgrade: websocket\r\n")),
        (
            "h2c-upgrade",
            _request(path, valid, headers=b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"),
        ),
        ("expect-continue", _request(path, valid, headers=b"Expect: 100-continue\r\n")),
        ("pipelined", _request(path, valid) + _request(path, b"{")),
    ]
    return entries


CASES = [(path, name, data) for path in ENDPOINTS for name, data in corpus(path)]


@pytest.mark.parametrize(("path", "name", "data"), CASES, ids=[f"{p}:{n}" for p, n, _ in CASES])
def test_every_raw_request_gets_an_answer_in_openai_shape(
    fuzz_gateway: FuzzGateway, path: str, name: str, data: bytes
) -> None:
    before = fuzz_gateway.requests_counted()
    answer = raw_exchange(fuzz_gateway.port, data)
    assert answer is not None, f"{name}: the gateway closed without an answer"
    status, headers, body = answer
    if status == 100:  # Expect: 100-continue, then the real answer follows on the same connection
        return
    if status >= 300:
        assert_openai_error(status, headers.get("content-type", ""), body)
        assert fuzz_gateway.requests_counted() == before, f"{name}: a refused request was counted"
    else:
        assert status == 200, (name, status, body[:300])


def test_after_the_corpus_no_breaker_is_open_and_memory_is_back(fuzz_gateway: FuzzGateway) -> None:
    assert set(fuzz_gateway.breakers().values()) == {"closed"}
    grown_kb = fuzz_gateway.rss_kb() - fuzz_gateway.rss_at_start_kb
    assert grown_kb < 10 * 1024, f"RSS grew by {grown_kb} kB"
