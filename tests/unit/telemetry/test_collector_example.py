"""deploy/otel-collector.yaml fits the gateway's defaults: it listens where the gateway sends spans, scrapes
where the gateway serves `/metrics`, and every pipeline names components the file defines."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import yaml

from gateway.config.settings import ServerOptions, Tracing

COLLECTOR = Path(__file__).resolve().parents[3] / "deploy" / "otel-collector.yaml"


def test_the_collector_example_receives_and_scrapes_where_the_gateway_is_by_default() -> None:
    config = yaml.safe_load(COLLECTOR.read_text())
    spans_to = urlsplit(Tracing().endpoint)
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == spans_to.netloc
    (job,) = config["receivers"]["prometheus"]["config"]["scrape_configs"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    (target,) = job["static_configs"][0]["targets"]
    assert target.rsplit(":", 1)[1] == str(ServerOptions().port)
    for name, pipeline in config["service"]["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in config[kind], f"pipeline {name} uses {kind[:-1]} {component}, not defined"
