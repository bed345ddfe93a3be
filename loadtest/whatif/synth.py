"""Access-log lines for a scenario's planned traffic, as the gateway would write them had it served it.

For benchmarks and tests that need a large recorded log without serving it (an hour of traffic is 36,000
requests): the outcome fields are left out, the replay fills them. The prompt hashes are the gateway's own
(`replay_keys`), and the prompt token count is the simulator's, so a replay sees what a recording would.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from backends.sim.text import chat_prompt_tokens
from gateway.telemetry.logs import replay_keys
from loadtest.workload import PlannedRequest

START = 1_700_000_000.0


class _Body(msgspec.Struct):
    messages: list[dict[str, str]]
    model: str
    max_tokens: int
    n: int = 1
    stream: bool = False


@dataclass(slots=True)
class _Keys:
    """The replay keys of a synthesised line (`replay_keys` sets them as it does on a `UsageRecord`)."""

    session: str | None = None
    affinity: str = ""
    prefix: list[str] | None = None


class _Prompt:
    def __init__(self, text: str) -> None:
        self.text = text

    def prompt_prefix(self, chars: int) -> str:
        return self.text[:chars]


def log_lines(requests: list[PlannedRequest]) -> list[dict[str, object]]:
    lines = []
    for request in requests:
        body = msgspec.json.decode(request.body, type=_Body)
        contents = [m["content"] for m in body.messages]
        text = "\n".join(contents)
        keys = _Keys()
        replay_keys(keys, _Prompt(text))
        line: dict[str, object] = {
            "ts": START + request.at_s,
            "request_id": f"req-{request.index}",
            "client_request_id": request.headers.get("x-request-id"),
            "endpoint": "/v1/chat/completions",
            "status": 200,
            "model": body.model,
            "stream": body.stream,
            "backend": "recorded",
            "class": request.request_class,
            "prompt_tokens": chat_prompt_tokens(contents),
            "completion_tokens": request.output_tokens * body.n,
            "prompt_chars": sum(len(c) for c in contents),
            "max_tokens": body.max_tokens,
            "n": body.n,
            "affinity": keys.affinity,
        }
        if keys.prefix:
            line["prefix"] = keys.prefix
        if "x-switchyard-priority" in request.headers:
            line["priority"] = request.headers["x-switchyard-priority"]
        lines.append(line)
    return lines


def write_log(requests: list[PlannedRequest], path: Path) -> Path:
    encode = msgspec.json.encode
    path.write_bytes(b"".join(encode(line) + b"\n" for line in log_lines(requests)))
    return path
