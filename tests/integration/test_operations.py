"""What an operator sees: the demo, the example config, start-up errors, logs without secrets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import openai

from gateway.config.settings import load_settings
from tests.integration.conftest import MODEL, Env
from tests.support import ROOT, free_port


def test_logs_never_contain_a_secret(env: Env) -> None:
    sdk = openai.OpenAI(base_url=env.base_url + "/v1", api_key="sk-client-secret-value", max_retries=0)
    sdk.chat.completions.create(model="echo-model", messages=[{"role": "user", "content": "x"}])
    sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2)
    usage = (
        httpx.get(env.base_url + "/admin/v1/usage?by=key").text
        + httpx.get(env.base_url + "/admin/v1/requests").text
    )
    log = (env.workdir / "gateway.log").read_text()
    assert "switchyard ready" in log
    for secret in ("sk-backend-secret", "sk-client-secret-value"):
        assert secret not in log
        assert secret not in usage


def test_example_config_is_valid(monkeypatch) -> None:
    monkeypatch.setenv("H100_A_KEY", "sk-example")
    settings = load_settings(ROOT / "deploy" / "switchyard.example.yaml")
    assert {p.vendor for p in settings.pools} == {"nvidia", "amd"}
    assert settings.server.port == 8080


def test_invalid_config_stops_start_up_naming_file_and_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(
        "pools:\n  - name: a\n    vendor: intel\n    accelerator: h100\n    price_per_gpu_hour: 1\n"
        "    backends: [{url: 'http://127.0.0.1:1', models: [m], max_model_len: 10}]\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert f"{config}:3" in result.stderr
    assert "vendor" in result.stderr


def test_demo_exits_after_traffic_with_the_routing_and_cost_table() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "demo",
            "--exit-after-traffic",
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "cost USD" in out
    assert "nvidia" in out and "amd" in out
    assert "(not in the ledger)" not in out
    rows = [line for line in out.splitlines() if line.startswith("req-")]
    assert len(rows) == 14
    classes = {line.split()[2] for line in rows}
    assert {"interactive", "long-context", "batch", "default"} <= classes
