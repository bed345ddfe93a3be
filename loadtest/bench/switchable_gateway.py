"""A gateway process whose telemetry a benchmark switches while it runs (loadtest/bench/telemetry.py).

Two processes of identical code differ by several percent in speed on a shared machine (hash seed, where
their memory landed), as much as the telemetry being measured. So one process serves every mode: it is
configured with everything on (metrics, access log, tracing of every request), builds a second tracer
that exports over OTLP, and on SIGUSR1 switches its pipeline's telemetry (`Pipeline.switch_telemetry`) to the
mode named in a file:

- `off`, `off-twin`: nothing wired: the per-request code of a gateway configured with telemetry off;
- `metrics+logs`: the defaults (`GET /metrics` cells and the JSON access log);
- `all@10%`: plus tracing of one request in ten (`sample_ratio: 0.1`), spans dropped by the child;
- `all`: plus tracing of every request, spans built and dropped by the span-export child (`exporter: none`);
- `all+otlp`: plus tracing exported over OTLP/HTTP to `--otlp`.

Not part of the product: the gateway itself only wires telemetry once, at start-up.

Usage: python -m loadtest.bench.switchable_gateway --config FILE --port N --mode-file FILE --otlp URL
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
from pathlib import Path

import uvicorn

from gateway.app import SwitchyardPlugin, asgi_entry, create_app
from gateway.config.settings import Tracing as TracingOptions
from gateway.config.settings import load_settings
from gateway.serve.server import server_config
from gateway.telemetry import build_tracing

MODES = ("off", "off-twin", "metrics+logs", "all@10%", "all", "all+otlp")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode-file", type=Path, required=True)
    parser.add_argument("--otlp", required=True, help="OTLP/HTTP traces endpoint for `all+otlp`")
    args = parser.parse_args(argv)
    logging.getLogger("switchyard.access").setLevel(logging.INFO)
    settings = load_settings(args.config)
    options = settings.telemetry
    if not (options.metrics and options.access_log.enabled and options.tracing.enabled):
        raise SystemExit("the config must turn metrics, the access log and tracing on")
    app = create_app(settings)
    plugin = app.plugins.get(SwitchyardPlugin)
    pipeline, telemetry = plugin.pipeline, plugin.telemetry
    dropped = plugin.tracing
    exported = build_tracing(TracingOptions(enabled=True, exporter="otlp", endpoint=args.otlp))
    tenth = build_tracing(TracingOptions(enabled=True, exporter="none", sample_ratio=0.1))
    wired = {
        "off": (None, None),
        "off-twin": (None, None),
        "metrics+logs": (telemetry, None),
        "all@10%": (telemetry, tenth),
        "all": (telemetry, dropped),
        "all+otlp": (telemetry, exported),
    }

    def switch(*_: object) -> None:
        mode = args.mode_file.read_text().strip()
        if mode not in wired:
            logging.getLogger("switchyard").warning("unknown telemetry mode %r", mode)
            return
        pipeline.switch_telemetry(*wired[mode])

    switch()
    signal.signal(signal.SIGUSR1, switch)
    config = server_config(settings, "127.0.0.1", args.port, "warning", app=asgi_entry(app))
    try:
        with contextlib.suppress(KeyboardInterrupt):
            uvicorn.Server(config).run()
    finally:  # the lifespan closed what the last mode had wired; closing again is harmless
        for tracing in (dropped, exported, tenth):
            if tracing is not None:
                tracing.shutdown()
        telemetry.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
