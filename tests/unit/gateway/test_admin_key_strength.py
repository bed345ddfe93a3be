"""A weak admin key stops the gateway from starting unless an explicit flag allows it, loudly."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from backends.lifetime import die_with_parent
from gateway.app import create_app
from gateway.config.settings import settings_from_text
from gateway.tenants.admin_key import WeakAdminKey, admin_key_weakness
from tests.support import ONE_POOL, ROOT, free_port

STRONG = "sy-strength-admin-" + "Xk2Lq9Vt4Rb7Nm1Zp5Wc8Hd3Fy6Gs0Ja"


@pytest.mark.parametrize(
    "key",
    [
        "a",
        "sy-admin",
        "x" * 31,  # shorter than 32
        "a" * 64,
        "abcd" * 10,  # too few distinct characters, evenly used
        "abcdefgh" * 4,
        "password1234" * 3,  # a shorter string repeated
        "0" * 40 + "123456789",  # mostly one character
    ],
)
def test_weak_keys_are_named_with_the_reason(key: str) -> None:
    reason = admin_key_weakness(key)
    assert reason is not None and reason


@pytest.mark.parametrize(
    "make",
    [
        lambda: secrets.token_hex(16),  # 32 hex characters: 128 random bits, the shortest accepted form
        lambda: secrets.token_hex(24),  # `openssl rand -hex 24`, what deploy/ suggests
        lambda: secrets.token_urlsafe(32),
        lambda: "sy-test-admin-" + secrets.token_hex(16),  # what the tests use
    ],
)
def test_generated_keys_are_strong(make) -> None:  # type: ignore[no-untyped-def]
    for _ in range(2000):
        key = make()
        assert admin_key_weakness(key) is None, key


def test_a_generated_key_with_lopsided_characters_is_still_strong() -> None:
    # `secrets.token_hex(16)` drew it in a test run; it scores 84.8 bits by its character frequencies
    assert admin_key_weakness("fb01bf31eff11100abb051101b1ac011") is None


def test_the_gateway_refuses_a_weak_admin_key_unless_the_config_allows_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("SWITCHYARD_ALLOW_WEAK_ADMIN_KEY", raising=False)
    monkeypatch.setenv("SWITCHYARD_ADMIN_KEY", "a")
    with pytest.raises(WeakAdminKey, match="allow_weak_admin_key"):
        create_app(settings_from_text(ONE_POOL))
    with caplog.at_level(logging.WARNING):
        create_app(settings_from_text(ONE_POOL + "auth: {allow_weak_admin_key: true}\n"))
    assert any("WEAK" in r.getMessage() and r.levelno >= logging.WARNING for r in caplog.records)
    monkeypatch.setenv("SWITCHYARD_ADMIN_KEY", STRONG)
    create_app(settings_from_text(ONE_POOL))


def _serve(config: Path, port: int, key: str, *flags: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "SWITCHYARD_ALLOW_WEAK_ADMIN_KEY"}
    env["SWITCHYARD_ADMIN_KEY"] = key
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--config",
            str(config),
            "--port",
            str(port),
            *flags,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )


def test_serve_with_a_weak_admin_key_exits_saying_why_and_the_flag_lets_it_start(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(ONE_POOL + "gateway: {health: {interval: 60}}\n")
    refused = _serve(config, free_port(), "a")
    out, _ = refused.communicate(timeout=60)
    assert refused.returncode == 2, out
    assert "weak" in out and "--allow-weak-admin-key" in out and "32" in out

    port = free_port()
    allowed = _serve(config, port, "a", "--allow-weak-admin-key")
    try:
        deadline = time.monotonic() + 30
        while True:
            assert allowed.poll() is None, allowed.communicate()[0]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "did not start"
            time.sleep(0.1)
    finally:
        os.killpg(allowed.pid, signal.SIGTERM)
        out, _ = allowed.communicate(timeout=20)
    assert "WEAK" in out
