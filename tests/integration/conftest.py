"""One simulated fleet and one gateway for the whole integration session.

The fleet serves the main model on two H100 and two MI300X backends, plus one model per failure the
API must report: a backend too slow to answer (504), one that fails (502), one that is down (503),
and a recording backend that shows what the gateway forwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from tests.support import RecordingBackend, free_port, running_gateway

MODEL = "llama-3.1-8b"
FLEET = f"""
model: {MODEL}
max_model_len: 4096
groups:
  - {{pool: h100, vendor: nvidia, accelerator: h100, count: 2, price_per_gpu_hour: 2.90,
      ttft_ms: 5, tpot_ms: 2}}
  - {{pool: mi300x, vendor: amd, accelerator: mi300x, count: 2, price_per_gpu_hour: 1.75, ttft_ms: 5,
      tpot_ms: 2, max_model_len: 16384}}
  - {{pool: slow, vendor: amd, accelerator: mi300x, price_per_gpu_hour: 1.75, ttft_ms: 5000,
      model: slow-model}}
  - {{pool: broken, vendor: nvidia, accelerator: h100, price_per_gpu_hour: 2.9, fail_status: 500,
      model: broken-model}}
"""
FIRST_BYTE_TIMEOUT = 1.0
MAX_BODY_BYTES = 65536


@dataclass
class Env:
    base_url: str
    fleet: Fleet
    recorder: RecordingBackend
    workdir: Path

    def backend_url(self, name: str) -> str:
        return next(b.url for b in self.fleet.backends if b.name == name)


@pytest.fixture(scope="session")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    workdir: Path = tmp_path_factory.mktemp("gateway")
    spec = parse_fleet_spec(FLEET, "<test fleet>")
    with Fleet(spec, log_dir=workdir) as fleet, RecordingBackend("echo-model") as recorder:
        config: dict[str, Any] = fleet.gateway_config(
            max_body_bytes=MAX_BODY_BYTES,
            timeouts={"connect": 1.0, "first_byte": FIRST_BYTE_TIMEOUT, "between_chunks": 5.0},
            health={"interval": 0.5, "timeout": 0.5},
        )
        # The API tests want plain spreading over every backend of a model; the presets have their own tests.
        policy = workdir / "spread.yaml"
        policy.write_text(
            "name: spread\nroutes:\n  default:\n    prefer: any\n    strategy: {least-outstanding: 1}\n"
        )
        config["policy"] = {"file": str(policy)}
        config["pools"] += [
            {
                "name": "down",
                "vendor": "nvidia",
                "accelerator": "h100",
                "price_per_gpu_hour": 2.9,
                "backends": [
                    {
                        "url": f"http://127.0.0.1:{free_port()}",
                        "models": ["down-model"],
                        "max_model_len": 4096,
                    }
                ],
            },
            {
                "name": "recorder",
                "vendor": "amd",
                "accelerator": "mi300x",
                "price_per_gpu_hour": 1.0,
                "backends": [
                    {
                        "url": recorder.url,
                        "models": ["echo-model"],
                        "max_model_len": 4096,
                        "api_key_env": "SY_TEST_BACKEND_KEY",
                    }
                ],
            },
        ]
        with running_gateway(config, workdir, env={"SY_TEST_BACKEND_KEY": "sk-backend-secret"}) as base:
            yield Env(base_url=base, fleet=fleet, recorder=recorder, workdir=workdir)
