"""The image's install step, run as the Dockerfile runs it, in a fresh virtualenv: only what the
Dockerfile copies, the exact `pip install` command, then the image's own health check against the
installed gateway. (No container engine runs on these machines; docs/deploy.md says how to build it.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import yaml

from tests.support import ROOT, free_port
from tests.unit.deploy.test_dockerfiles import install_command, instructions

DOCKERFILE = ROOT / "deploy" / "docker" / "gateway.Dockerfile"


def test_the_image_install_step_yields_a_gateway_that_passes_the_image_health_check(tmp_path: Path) -> None:
    steps = instructions(DOCKERFILE)
    context = tmp_path / "src"
    context.mkdir()
    for op, arg in steps:
        if op == "COPY" and not arg.startswith("--from"):
            *sources, _dest = arg.split()
            for source in sources:
                target = ROOT / source
                if target.is_dir():
                    shutil.copytree(target, context / source, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    (context / source).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(target, context / source)
    venv = tmp_path / "opt-switchyard"
    command = install_command(DOCKERFILE).replace("/opt/switchyard", str(venv))
    result = subprocess.run(["sh", "-c", command], cwd=context, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    installed = subprocess.run(
        [venv / "bin" / "pip", "list", "--format=json"], capture_output=True, text=True
    )
    names = {p["name"].lower() for p in json.loads(installed.stdout)}
    assert "switchyard" in names and not names & {"pytest", "ruff", "kubernetes-validate"}

    # The image's CMD, with a config of its own, and its HEALTHCHECK command.
    port = free_port()
    config = tmp_path / "gateway.yaml"
    backend = {"name": "a", "url": "http://127.0.0.1:9", "models": ["m"], "max_model_len": 64}
    pool = {
        "name": "p",
        "vendor": "amd",
        "accelerator": "mi300x",
        "price_per_gpu_hour": 1,
        "backends": [backend],
    }
    config.write_text(yaml.safe_dump({"gateway": {"port": port}, "pools": [pool]}))
    cmd = json.loads(dict(steps)["CMD"])
    cmd[cmd.index("--config") + 1] = str(config)
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    gateway = subprocess.Popen(
        [venv / "bin" / "switchyard", *cmd], cwd=tmp_path, env=env, start_new_session=True
    )
    health = json.loads(re.search(r"CMD (\[.*\])", dict(steps)["HEALTHCHECK"]).group(1))  # type: ignore[union-attr]
    health = [part.replace(":8080/", f":{port}/") for part in health]
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(health, env=env, cwd=tmp_path, capture_output=True).returncode != 0:
            assert gateway.poll() is None, "the installed gateway exited"
            assert time.monotonic() < deadline, "the image's health check never passed"
            time.sleep(0.3)
    finally:
        os.killpg(gateway.pid, signal.SIGTERM)
        gateway.wait(timeout=30)
