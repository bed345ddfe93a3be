"""`switchyard serve --workers 2`: two processes on one port, one fleet view, a dead worker restarted,
and no worker outliving a SIGKILLed supervisor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import yaml

from tests.support import ROOT, clean_redis, free_port


def _pids(parent: int) -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def _wait(check, within: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_workers_share_one_port_and_one_view_and_are_restarted(tmp_path: Path) -> None:
    port = free_port()
    prefix = f"test-w-{uuid.uuid4().hex[:8]}"
    config = {
        "gateway": {"port": port, "shutdown_grace": 2},
        "ledger": {"redis_url": "redis://127.0.0.1:6379/0", "key_prefix": prefix},
        "telemetry": {"access_log": {"enabled": False}},
        "pools": [
            {
                "name": "h100",
                "vendor": "nvidia",
                "accelerator": "h100",
                "price_per_gpu_hour": 2.9,
                "backends": [
                    {"name": "h100-a", "url": "http://127.0.0.1:9", "models": ["m"], "max_model_len": 64}
                ],
            }
        ],
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path), "--workers", "2"]
    supervisor = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/ready"
    try:
        _wait(lambda: len(_pids(supervisor.pid)) == 2, 10)
        workers = _pids(supervisor.pid)

        def replicas_answering() -> set[str]:
            seen = set()
            for _ in range(40):
                try:
                    fleet = httpx.get(url, timeout=2, trust_env=False).json()["fleet"]
                except httpx.HTTPError:
                    continue
                if fleet["replicas_seen"] == 2:
                    seen.add(fleet["replica"])
            return seen

        _wait(lambda: len(replicas_answering()) == 2, 30)  # both serve the port, each sees both
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: len(_pids(supervisor.pid)) == 2 and victim not in _pids(supervisor.pid), 10)
        workers = _pids(supervisor.pid)
        supervisor.kill()  # SIGKILL: the workers get SIGTERM from the kernel (PR_SET_PDEATHSIG)
        supervisor.wait()

        def all_gone() -> bool:
            return not any(Path(f"/proc/{pid}").exists() and _alive(pid) for pid in workers)

        _wait(all_gone, 15)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
        clean_redis(prefix)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"
