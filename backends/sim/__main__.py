"""`python -m backends.sim`: run one simulated vLLM server until SIGINT or SIGTERM.

Without `--gpu` every request gets the fixed `--ttft-ms`/`--tpot-ms`; with `--gpu` (and a model
profile, by default the first `--model` if it names one) the continuous-batching performance model
times them; with `--calibrated profile.yaml` the profile `switchyard calibrate` measured on a real server
does (backends/calibrated.py). Fault flags set the faults at start; `POST /sim/faults` changes them at
run time.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from backends.accelerators import calibrated
from backends.calibrated import load_profile
from backends.sim.app import start_server
from backends.sim.faults import Faults
from backends.sim.options import SimOptions
from backends.sim.profiles import (
    GPUS,
    MODEL_ALIASES,
    MODELS,
    ProfileError,
    build_hardware,
    calibrated_hardware,
)
from backends.yamlfile import ConfigError


def _override(text: str) -> tuple[str, float]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=NUMBER, got {text!r}")
    try:
        return key.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KEY=NUMBER, got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m backends.sim", description="Simulated vLLM OpenAI server"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--name", default="sim", help="backend name, used in logs and simulated errors")
    parser.add_argument("--model", action="append", dest="models", help="served model (repeatable)")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument(
        "--ttft-ms", type=float, default=20.0, help="fixed timing: delay before the first token"
    )
    parser.add_argument(
        "--tpot-ms", type=float, default=5.0, help="fixed timing: delay between output tokens"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fail-status", type=int, default=None, help="answer every request with this status")
    parser.add_argument("--kv-cache-tokens", type=int, default=400_000, help="fixed timing: notional KV size")
    model = parser.add_argument_group("performance model")
    model.add_argument("--gpu", default=None, help=f"GPU profile ({', '.join(GPUS)}) or accelerator name")
    model.add_argument(
        "--calibrated", default=None, metavar="PROFILE.yaml",
        help="time requests with a profile measured by `switchyard calibrate` (instead of --gpu)",
    )  # fmt: skip
    model.add_argument("--model-profile", default=None, help="model profile (default: the served model)")
    model.add_argument("--gpus", type=int, default=1, help="GPUs per backend (tensor parallel)")
    model.add_argument(
        "--profile-override", action="append", type=_override, default=[], metavar="KEY=NUMBER",
        help="override one profile figure, e.g. hbm_bandwidth_tbps=3.0 or bw_eff.half=64 (repeatable)",
    )  # fmt: skip
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulated seconds per real second")
    faults = parser.add_argument_group("faults (see backends/sim/faults.py; also POST /sim/faults)")
    faults.add_argument("--error-rate", type=float, default=0.0)
    faults.add_argument("--error-status", type=int, default=503)
    faults.add_argument("--added-latency-ms", type=float, default=0.0)
    faults.add_argument("--hang", action="store_true")
    faults.add_argument("--die-after-tokens", type=int, default=None)
    faults.add_argument("--refuse-connections-s", type=float, default=None)
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    return parser.parse_args(argv)


def options_from_args(args: argparse.Namespace) -> SimOptions:
    """Build the server options; raises ProfileError or ValueError on a profile that cannot run."""
    models = tuple(args.models or ["sim-model"])
    hardware = None
    if args.calibrated is not None and args.gpu is not None:
        raise ProfileError("--calibrated and --gpu are alternatives; give one")
    if args.calibrated is not None:
        try:
            hardware = calibrated_hardware(load_profile(args.calibrated))
        except ConfigError as exc:
            raise ProfileError(str(exc)) from None
    elif args.gpu is not None:
        profile = args.model_profile or models[0]
        known = MODEL_ALIASES.get(profile, profile) in MODELS or calibrated(args.gpu, profile) is not None
        if args.model_profile is None and not known:
            raise ProfileError(f"model `{profile}` has no profile; pass --model-profile")
        hardware = build_hardware(args.gpu, profile, args.gpus, dict(args.profile_override))
    faults = Faults(
        error_rate=args.error_rate,
        error_status=args.error_status,
        added_latency_ms=args.added_latency_ms,
        hang=args.hang,
        die_after_tokens=args.die_after_tokens,
        refuse_connections_s=args.refuse_connections_s,
    )
    if not 0 <= faults.error_rate <= 1 or args.time_scale <= 0:
        raise ValueError("--error-rate must be within 0..1 and --time-scale positive")
    options = SimOptions(
        models=models,
        name=args.name,
        max_model_len=args.max_model_len,
        ttft_ms=args.ttft_ms,
        tpot_ms=args.tpot_ms,
        seed=args.seed,
        fail_status=args.fail_status,
        kv_capacity_tokens=args.kv_cache_tokens,
        hardware=hardware,
        time_scale=args.time_scale,
        faults=faults,
    )
    options.check()
    return options


async def serve(options: SimOptions, host: str, port: int) -> None:
    server = await start_server(options, host, port)
    logging.getLogger("backends.sim").info("%s listening on %s", options.name, server.url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        options = options_from_args(args)
    except ValueError as exc:  # ProfileError is a ValueError
        print(f"error: {args.name}: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(options, args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
