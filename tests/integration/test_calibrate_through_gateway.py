"""A sweep sent through a gateway (`switchyard calibrate --through-gateway`, the calibration test): the
timed requests go through the gateway in front of the server, while what the server says of itself
(/tokenize, /v1/models, /metrics) is asked of the server; and the access log the check replays keeps
only the held-apart requests, not the sweep's."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import httpx

from backends.lifetime import stop_process
from loadtest.calibrate.legs import WRONG, gateway_in_front, held_apart_only, start_simulator
from loadtest.calibrate.measure import Server
from tests.support import metric, parse_metrics, sim_metrics

MODEL = "tiny"
MAX_MODEL_LEN = 512


def _gateway_requests(base: str) -> float:
    return metric(
        parse_metrics(httpx.get(base + "/metrics", trust_env=False).text), "switchyard_requests_total"
    )


def test_timed_requests_go_through_the_gateway_and_the_rest_to_the_server(tmp_path: Path) -> None:
    process, url = start_simulator(WRONG, MODEL, MAX_MODEL_LEN, tmp_path / "sim.log")
    try:
        with gateway_in_front(url, MODEL, MAX_MODEL_LEN, tmp_path) as front:

            async def sweep_like() -> tuple[int, int]:
                server = Server(url, MODEL, through=front)
                try:
                    length = await server.max_model_len()  # of the server, as /metrics is
                    assert (await server.metrics()).info.get("vllm:cache_config_info")
                    timed = await server.complete([11, 12, 13, 14, 15], 4)
                    server.vocabulary = list(range(11, 40))
                    hop = await server.gateway_hop(random.Random(1), pairs=4)
                    assert 0.0 <= hop < 0.05, hop  # what the gateway adds, not the server's own time
                    direct = Server(url, MODEL)
                    try:
                        assert await direct.gateway_hop(random.Random(1)) == 0.0  # no gateway: no hop
                    finally:
                        await direct.close()
                    return length, timed.output_tokens
                finally:
                    await server.close()

            before = metric(sim_metrics(url), "vllm:request_success_total")
            length, output = asyncio.run(sweep_like())
            assert (length, output) == (MAX_MODEL_LEN, 4)
            # the timed request and four of the hop's eight crossed the gateway, and all reached the server
            assert _gateway_requests(front) == 1 + 4
            assert metric(sim_metrics(url), "vllm:request_success_total") == before + 1 + 8
    finally:
        stop_process(process)


def test_the_access_log_keeps_only_the_requests_that_named_their_class(tmp_path: Path) -> None:
    log = tmp_path / "access.jsonl"
    lines = [
        {"request_id": "sweep-1", "class_header": None},
        {"request_id": "held-1", "class_header": "chat"},
        {"request_id": "sweep-2"},
        {"request_id": "held-2", "class_header": "bulk"},
    ]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    held_apart_only(log)
    kept = [json.loads(line)["request_id"] for line in log.read_text().splitlines()]
    assert kept == ["held-1", "held-2"]
