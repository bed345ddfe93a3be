"""The scenario's batch job: its lines (drawn from the seed like the rest of the plan), submitted through
`/v1/files` and `/v1/batches` at the start of the run, and polled until it ends."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import httpx

from loadtest.guard import require_loopback
from loadtest.scenario import Scenario
from loadtest.workload import _words, draw_length


def batch_input(scenario: Scenario) -> tuple[bytes, int]:
    """The JSONL input and the prompt tokens it holds."""
    job = scenario.spec.batch
    assert job is not None
    rng = random.Random(f"{scenario.spec.seed}/batch")
    lines, prompt = [], 0
    for i in range(job.lines):
        tokens = draw_length(job.prompt_tokens, rng)
        prompt += tokens
        body = {
            "model": scenario.model,
            "messages": [{"role": "user", "content": f"Batch item {i}: " + _words(rng, tokens)}],
            "max_tokens": draw_length(job.output_tokens, rng),
            "seed": i,
        }
        lines.append(
            json.dumps(
                {"custom_id": f"item-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            )
        )
    return ("\n".join(lines) + "\n").encode(), prompt


def submit(base_url: str, scenario: Scenario) -> str:
    base = require_loopback(base_url).rstrip("/")
    data, _ = batch_input(scenario)
    with httpx.Client(base_url=base, timeout=60, trust_env=False) as client:
        uploaded = client.post("/v1/files", files={"file": ("batch.jsonl", data)}, data={"purpose": "batch"})
        uploaded.raise_for_status()
        created = client.post(
            "/v1/batches",
            json={
                "input_file_id": uploaded.json()["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        created.raise_for_status()
    return str(created.json()["id"])


def wait(base_url: str, batch_id: str, until: float) -> tuple[dict[str, Any], float | None]:
    """Poll until the batch ends or the monotonic time `until`: its last state, and the monotonic time
    it was first seen completed (None if it was not). Run beside the online traffic (a thread), so the
    time is the batch's own, not the end of the online drain."""
    base = require_loopback(base_url).rstrip("/")
    with httpx.Client(base_url=base, timeout=10, trust_env=False) as client:
        while True:
            batch = client.get(f"/v1/batches/{batch_id}").json()
            if batch["status"] == "completed":
                return batch, time.monotonic()
            if batch["status"] in ("failed", "expired", "cancelled") or time.monotonic() >= until:
                return batch, None
            time.sleep(0.25)


def batch_report(
    batch: dict[str, Any], started: float, ended: float | None, run_s: float, time_scale: float
) -> dict[str, Any]:
    """The batch's outcome; times in simulated seconds from the start of the run (`run_s` real seconds
    long, the time the fleet was paid for)."""
    counts = batch.get("request_counts") or {}
    return {
        "id": batch["id"],
        "status": batch["status"],
        "lines": counts.get("total"),
        "completed": counts.get("completed"),
        "failed": counts.get("failed"),
        "finished_after_s": None if ended is None else round((ended - started) * time_scale, 1),
        "run_s": round(run_s * time_scale, 1),
    }
