"""The console in a real headless browser: Debian's chromium driven by Playwright (never `playwright
install`: `make browser` installs the system chromium). Two gateway replicas share the real Redis under a
private key prefix, in front of a simulated fleet; screenshots go to $SWITCHYARD_ARTIFACTS/console (or a
temporary folder), and into docs/console-screenshots/ with SWITCHYARD_UPDATE_SCREENSHOTS=1.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import yaml

from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from gateway.config.settings import load_settings
from gateway.ledger.records import UsageRecord
from gateway.ledger.redis_store import RedisLedger
from tests.support import ROOT, clean_redis, running_replicas

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ADMIN_KEY = "sy-console-admin-" + uuid.uuid4().hex
MODEL = "llama-3.1-8b"
FLEET = f"""
model: {MODEL}
max_model_len: 4096
groups:
  - {{pool: h100, vendor: nvidia, accelerator: h100, count: 2, price_per_gpu_hour: 2.90, ttft_ms: 5,
      tpot_ms: 1}}
  - {{pool: mi300x, vendor: amd, accelerator: mi300x, count: 2, price_per_gpu_hour: 1.75, ttft_ms: 5,
      tpot_ms: 1}}
"""
REPO_SCREENSHOTS = ROOT / "docs" / "console-screenshots"
DOCS_SHOTS = {"fleet", "costs", "routing-explain", "keys-created", "fleet-failing", "fleet-800px"}
"""The screenshots docs/console.md shows, one per page."""

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing: run `make browser` (make test does)", allow_module_level=True)


@dataclass
class Replicas:
    urls: list[str]
    prefix: str
    fleet: Fleet
    traffic_key: str
    logs: list[Path] = field(default_factory=list)

    def admin(self, i: int = 0) -> httpx.Client:
        headers = {"authorization": f"Bearer {ADMIN_KEY}"}
        return httpx.Client(base_url=self.urls[i], headers=headers, timeout=10, trust_env=False)


def gateway_config(pools: list[dict[str, Any]], prefix: str, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    policy = workdir / "spread.yaml"
    policy.write_text(
        "name: spread\nroutes:\n  default:\n    prefer: any\n    strategy: {least-outstanding: 1}\n"
    )
    return {
        "gateway": {"health": {"interval": 0.5, "timeout": 0.5}},
        "pools": pools,
        "policy": {"file": str(policy)},
        "ledger": {
            "redis_url": "redis://127.0.0.1:6379/0",
            "key_prefix": prefix,
            "flush_interval": 0.05,
            "refresh_interval": 0.3,
        },
        "auth": {"mode": "keys", "replicas": 2},
        "telemetry": {"access_log": {"enabled": False}},
    }


def seed_history(config_path: Path, hours: int = 24, per_hour: int = 6, seed: int = 7) -> None:
    """A day of usage and paid GPU time, written by the gateway's own Redis ledger (as a replica would)."""
    settings = load_settings(config_path)
    rng = random.Random(seed)

    async def write() -> None:
        options = msgspec.structs.replace(settings.ledger, redis_timeout=30.0)
        ledger = RedisLedger(options, settings.backends)
        now = time.time()
        ledger._started_at = now - hours * 3600
        for h in range(hours):
            for backend in settings.backends:
                for n in range(per_hour):
                    finished = now - (hours - h) * 3600 + n * (3600 / per_hour) + rng.random() * 60
                    prompt, completion = rng.randint(200, 2000), rng.randint(50, 600)
                    ledger.record(
                        UsageRecord(
                            request_id=f"seed-{uuid.uuid4().hex}",
                            endpoint="chat",
                            model=MODEL,
                            backend=backend.name,
                            pool=backend.pool.name,
                            vendor=backend.pool.vendor,
                            accelerator=backend.pool.accelerator,
                            key="",
                            request_class="default",
                            route="default",
                            stream=False,
                            status=200,
                            prompt_tokens=prompt,
                            completion_tokens=completion,
                            usage_source="backend",
                            ttft_s=0.05,
                            duration_s=1.0,
                            cost_usd=(prompt + 4 * completion)
                            * 2e-9
                            * (2 if backend.pool.vendor == "nvidia" else 1),
                            finished_at=finished,
                            busy_s=rng.uniform(0.2, 3.0),
                        )
                    )
        assert await ledger.flush()
        for h in range(hours, -1, -1):  # the paid GPU time, an hour per call as a running replica claims it
            await ledger.tick(now - h * 3600)
        await ledger.client.aclose()

    # Its own thread: Playwright's sync API keeps an event loop running in this one.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, write()).result()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("SWITCHYARD_ARTIFACTS")
    folder = Path(given) / "console" if given else tmp_path_factory.mktemp("console-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_screenshot(page: Any, folder: Path, name: str) -> Path:
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if name in DOCS_SHOTS and os.environ.get("SWITCHYARD_UPDATE_SCREENSHOTS") == "1":
        REPO_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        (REPO_SCREENSHOTS / path.name).write_bytes(path.read_bytes())
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Per module, not per session: Playwright's sync API runs an event loop in this thread while it is
    open, and the asyncio tests that run after the browser tests need the thread without one."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    prefix = f"btest-console-{uuid.uuid4().hex[:10]}"
    spec = parse_fleet_spec(FLEET, "<console fleet>")
    try:
        with Fleet(spec, log_dir=tmp_path_factory.mktemp("console-fleet")) as fleet:
            pools = fleet.gateway_config()["pools"]
            workdirs = [tmp_path_factory.mktemp(f"console-gw-{n}") for n in "ab"]
            config = gateway_config(pools, prefix, workdirs[0])
            seed_path = workdirs[0] / "seed.yaml"
            seed_path.write_text(yaml.safe_dump(config))
            seed_history(seed_path)
            env = {"SWITCHYARD_ADMIN_KEY": ADMIN_KEY}
            with running_replicas([config] * len(workdirs), workdirs, env) as urls:
                with httpx.Client(base_url=urls[0], timeout=10, trust_env=False) as client:
                    created = client.post(
                        "/admin/v1/keys",
                        json={"name": "traffic", "team": "demo", "budget_usd": 5.0},
                        headers={"authorization": f"Bearer {ADMIN_KEY}"},
                    )
                assert created.status_code == 201, created.text
                logs = [w / "gateway.log" for w in workdirs]
                yield Replicas(urls, prefix, fleet, created.json()["key"], logs)
    finally:
        clean_redis(prefix)


def login(page: Any, base_url: str, key: str = ADMIN_KEY) -> None:
    page.goto(base_url + "/console/login")
    page.fill("input[name=admin_key]", key)
    page.click("button[type=submit]")
    page.wait_for_url(base_url + "/console/fleet")


@pytest.fixture
def console_errors() -> list[str]:
    return []


@pytest.fixture
def new_page(browser: Any, console_errors: list[str]) -> Iterator[Any]:
    """A fresh browser context (no cookies) with a page that records console errors and page errors."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: console_errors.append(str(exc)))
    try:
        yield page
    finally:
        context.close()
