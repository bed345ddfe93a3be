"""`switchyard calibrate`: measure a live vLLM server, fit its profile, write it.

    switchyard calibrate --url http://backend:8000 [--model M] [--accelerator mi300x] [--out profile.yaml]
        [--budget 10m] [--max-concurrency 64] [--seed 1] [--through-gateway]

What it sends and how long it takes: loadtest/calibrate/sweep.py and docs/calibrate.md.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backends.calibrated import CalibratedProfile
    from loadtest.calibrate.options import Options

HELP = "measure a live vLLM server (a concurrency x prompt x output sweep) and write its fitted profile"
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h)?$")


def parse_duration(text: str) -> float:
    """`90`, `90s`, `10m`, `1h` -> seconds; raises argparse.ArgumentTypeError."""
    match = _DURATION_RE.match(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"`{text}` is not a duration (e.g. 90s, 10m, 1h)")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"`{text}` is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="the vLLM server's base URL (http://host:8000)")
    parser.add_argument(
        "--model", default=None, help="the served model name to measure (default: the one the server serves)"
    )
    parser.add_argument(
        "--accelerator",
        default="unknown",
        help="what it runs on, as the catalogue names it (mi300x, h100; cpu)",
    )
    parser.add_argument("--out", type=Path, default=None, help="profile file (default: stdout)")
    parser.add_argument("--budget", type=parse_duration, default=600.0, help="stop within this (default 10m)")
    parser.add_argument(
        "--max-concurrency", type=_positive, default=64, help="never more requests at once (default 64)"
    )
    parser.add_argument("--seed", type=int, default=1, help="prompt contents (default 1)")
    parser.add_argument("--max-num-seqs", type=_positive, default=None, help="the server's, if known")
    parser.add_argument(
        "--max-num-batched-tokens", type=_positive, default=None, help="the server's, if known"
    )
    parser.add_argument(
        "--through-gateway",
        action="store_true",
        help="send the timed requests through a gateway started in front of the server on this machine, "
        "so the profile holds the hop it adds (as the calibration check's real leg pays it)",
    )


def _through_gateway(options: Options) -> CalibratedProfile:
    """The sweep sent through a gateway of the check's shape in front of `options.url`
    (loadtest/calibrate/legs.py), stopped once the sweep ends."""
    import asyncio
    import tempfile

    from loadtest.calibrate.legs import gateway_in_front
    from loadtest.calibrate.measure import Server
    from loadtest.calibrate.sweep import calibrate

    async def served() -> tuple[str, int]:
        server = Server(options.url, options.model)
        try:
            model = options.model or await server.only_model()
            server.model = model
            return model, await server.max_model_len()
        finally:
            await server.close()

    options.model, max_model_len = asyncio.run(served())
    with (
        tempfile.TemporaryDirectory(prefix="switchyard-calibrate-") as workdir,
        gateway_in_front(options.url, options.model, max_model_len, Path(workdir)) as front,
    ):
        options.through = front
        return calibrate(options)


def run(args: argparse.Namespace) -> int:
    import logging

    from backends.calibrated import dump_profile
    from loadtest.calibrate.measure import ServerError
    from loadtest.calibrate.options import Options
    from loadtest.calibrate.sweep import calibrate

    logging.getLogger("httpx").setLevel(logging.WARNING)
    options = Options(
        url=args.url,
        model=args.model or "",
        accelerator=args.accelerator.strip().lower(),
        budget_s=args.budget,
        max_concurrency=args.max_concurrency,
        seed=args.seed,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    try:
        profile = _through_gateway(options) if args.through_gateway else calibrate(options)
    except (ServerError, ValueError, OSError) as exc:
        print(f"switchyard calibrate: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # an HTTP failure (httpx) mid-sweep: say what, not a traceback
        print(f"switchyard calibrate: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    text = dump_profile(profile)
    error = profile.fit_error
    print(
        f"fit error on its own points: TTFT mean {error.ttft_mean:.0%} (max {error.ttft_max:.0%}), "
        f"TPOT mean {error.tpot_mean:.0%} (max {error.tpot_max:.0%})",
        file=sys.stderr,
    )
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
        print(f"profile: {args.out}", file=sys.stderr)
    return 0
