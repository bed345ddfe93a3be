"""The Messages and Responses APIs' typed event streams (`event: <type>` then `data: {...}`), relayed as
they arrive, read only for accounting, and their errors in each API's own shape.

    Messages:   `message_start.message.usage.input_tokens`, then `message_delta.usage.output_tokens`
                (cumulative; vLLM repeats `input_tokens` there too)
    Responses:  `response.completed` (or `.incomplete`, `.failed`) `.response.usage`; the final response
                object is kept for the gateway's response store (gateway/responses/)

As in gateway/request/sse.py, events are scanned, not parsed: only an event mentioning `"usage"` with a
value is decoded. Nothing is dropped or rewritten: these streams always carry their usage.
"""

from __future__ import annotations

import msgspec

from gateway.openai.errors import GatewayError, anthropic_error_json
from gateway.openai.responses import TokenUsage, Usage, token_usage_decoder
from gateway.request.sse import SseRelay

_EVENT_END = b"\n\n"
_USAGE_KEY = b'"usage"'
_NULL_VALUE = b":null"
_DATA = b"data: "
_DELTA_EVENT = b"delta\n"
"""The end of an `event:` line of generated text (`content_block_delta`, `response.output_text.delta`):
counted to estimate a stream's tokens when it ends without usage."""
_FINAL_RESPONSE = frozenset({"response.completed", "response.incomplete", "response.failed"})


class _Holder(msgspec.Struct):
    usage: TokenUsage | None = None


class _Event(msgspec.Struct):
    type: str = ""
    usage: TokenUsage | None = None
    message: _Holder | None = None
    response: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    """Empty when absent (msgspec does not take `Raw | None`)."""


_event_decoder = msgspec.json.Decoder(_Event)
_holder_decoder = msgspec.json.Decoder(_Holder)
_encoder = msgspec.json.Encoder()


class TypedSseRelay(SseRelay):
    __slots__ = ("_endpoint", "_input", "_output", "final_response")

    def __init__(self, endpoint: str) -> None:
        super().__init__(keep_usage_chunk=True)
        self._endpoint = endpoint
        self._input: int | None = None
        self._output: int | None = None
        self._counted = 1  # `events`: accounting counts events past the first as generated tokens
        self.final_response: bytes | None = None
        """The Responses stream's final response object, as sent."""

    def feed(self, data: bytes) -> bytes:
        if self._tail:
            data = self._tail + data
        end = data.rfind(_EVENT_END)
        if end < 0:
            self._tail = data
            return b""
        end += 2
        complete, self._tail = data[:end], data[end:]
        self._counted += complete.count(_DELTA_EVENT)
        at = complete.find(_USAGE_KEY)
        while at >= 0:
            start = complete.rfind(_EVENT_END, 0, at)
            start = 0 if start < 0 else start + 2
            stop = complete.find(_EVENT_END, at)
            if not complete.startswith(_NULL_VALUE, at + len(_USAGE_KEY)):
                self._read(complete[start:stop])
            at = complete.find(_USAGE_KEY, stop)
        return complete

    def _read(self, event: bytes) -> None:
        at = event.find(_DATA)
        if at < 0:
            return
        line_end = event.find(b"\n", at)
        try:
            decoded = _event_decoder.decode(event[at + len(_DATA) : line_end if line_end >= 0 else None])
            usage = decoded.usage
            if decoded.message is not None and usage is None:
                usage = decoded.message.usage
            if len(decoded.response):
                usage = _holder_decoder.decode(decoded.response).usage
                if decoded.type in _FINAL_RESPONSE:
                    self.final_response = bytes(decoded.response)
        except msgspec.DecodeError:
            return
        if usage is None:
            return
        if usage.input_tokens is not None:
            self._input = usage.input_tokens
        if usage.output_tokens is not None:
            self._output = usage.output_tokens
        if self._input is not None and self._output is not None:
            self.usage = Usage(self._input, self._output, self._input + self._output)

    def error_event(self, error: GatewayError) -> bytes:
        if self._endpoint == "messages":
            return b"event: error\ndata: " + anthropic_error_json(error) + b"\n\n"
        body = error.body
        event = {
            "type": "error",
            "code": body.code,
            "message": body.message,
            "param": body.param,
            "sequence_number": self.events,
        }
        return b"event: error\ndata: " + _encoder.encode(event) + b"\n\n"


def typed_usage(body: bytes) -> Usage | None:
    """A whole Messages or Responses answer's usage, as the ledger counts it."""
    try:
        usage = token_usage_decoder.decode(body).usage
    except msgspec.DecodeError:
        return None
    if usage is None or usage.input_tokens is None or usage.output_tokens is None:
        return None
    return Usage(usage.input_tokens, usage.output_tokens, usage.input_tokens + usage.output_tokens)
