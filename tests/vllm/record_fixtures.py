"""Record real vLLM responses into tests/vllm/fixtures/ for the simulator's contract test.

    .venv/bin/python -m tests.vllm.record_fixtures                   # starts a CPU server of the tiny model
    .venv/bin/python -m tests.vllm.record_fixtures --url http://127.0.0.1:8000 --model tiny-llama

Run it once after a vLLM upgrade (`make test-vllm` builds the venv and the model it needs), review the diff,
and let `tests/unit/backends/test_sim_contract.py` say where the simulator no longer matches. Values
(ids, timestamps, text) are kept as recorded; the contract test compares shapes only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from backends.launcher import LaunchSpec, build_launch
from backends.server_process import start, stop, wait_ready

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "switchyard"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello, world!"}]


def requests(model: str) -> dict[str, tuple[str, str, dict[str, Any] | None]]:
    """fixture name -> (method, path, JSON body)."""
    chat = {"model": model, "messages": MESSAGES, "max_tokens": 4, "temperature": 0}
    completion = {"model": model, "prompt": "Hello, world!", "max_tokens": 4, "temperature": 0}
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    response = {"model": model, "input": "Hello, world!", "max_output_tokens": 4, "temperature": 0}
    message = {"model": model, "messages": MESSAGES[1:], "system": "You are terse.", "max_tokens": 4}
    return {
        "models.json": ("GET", "/v1/models", None),
        "chat.json": ("POST", "/v1/chat/completions", chat),
        "chat_stream.sse": ("POST", "/v1/chat/completions", {**chat, **usage}),
        "chat_stream_no_usage.sse": ("POST", "/v1/chat/completions", {**chat, "stream": True}),
        "completion.json": ("POST", "/v1/completions", completion),
        "completion_stream.sse": ("POST", "/v1/completions", {**completion, **usage}),
        "error_unknown_model.json": ("POST", "/v1/chat/completions", {**chat, "model": "no-such-model"}),
        "error_too_long.json": ("POST", "/v1/chat/completions", {**chat, "max_tokens": 100_000}),
        "responses.json": ("POST", "/v1/responses", response),
        "responses_stream.sse": ("POST", "/v1/responses", {**response, "stream": True}),
        "messages.json": ("POST", "/v1/messages", {**message, "temperature": 0}),
        "messages_stream.sse": ("POST", "/v1/messages", {**message, "temperature": 0, "stream": True}),
        "error_messages_unknown_model.json": ("POST", "/v1/messages", {**message, "model": "no-such-model"}),
        "metrics.txt": ("GET", "/metrics", None),
    }


def record(url: str, model: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    index: dict[str, Any] = {}
    with httpx.Client(base_url=url, timeout=60, trust_env=False) as http:
        version = http.get("/version").json().get("version")
        for name, (method, path, body) in requests(model).items():
            r = http.request(method, path, json=body)
            text = r.text
            if name.endswith(".json"):
                data = r.json()
                if name == "models.json":  # `root` is the path the server was started with: this machine's
                    for card in data.get("data", []):
                        card["root"] = model
                text = json.dumps(data, indent=2) + "\n"
            (out / name).write_text(text)
            index[name] = {
                "method": method,
                "path": path,
                "request": body,
                "status": r.status_code,
                "content_type": r.headers.get("content-type"),
            }
            print(f"{name}: {r.status_code} {len(text)} bytes")
    meta = {"vllm_version": version, "served_model_name": model, "fixtures": index}
    (out / "index.json").write_text(json.dumps(meta, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running vLLM server; default: start a CPU server of the tiny model")
    parser.add_argument("--model", default="tiny-llama", help="the served model name")
    parser.add_argument("--python", default=str(CACHE / "vllm-venv" / "bin" / "python"))
    parser.add_argument("--model-path", default=str(CACHE / "tiny-llama"))
    parser.add_argument("--port", type=int, default=18931)
    parser.add_argument("--out", type=Path, default=FIXTURES)
    args = parser.parse_args(argv)
    if args.url:
        record(args.url, args.model, args.out)
        return 0
    launch = build_launch(
        LaunchSpec(
            vendor="cpu",
            model=args.model_path,
            served_model_name=[args.model],
            python=args.python,
            port=args.port,
        )
    )
    log = args.out.parent / "record-server.log"
    process = start(launch, log)
    try:
        wait_ready(launch.url, process, log, timeout=240)
        record(launch.url, args.model, args.out)
    finally:
        stop(process)
        log.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
