"""The vLLM launcher's commands and environments for ROCm, CUDA and CPU (no vLLM needed)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from backends.launcher import LaunchError, LaunchSpec, build_launch, main
from backends.server_process import start, stop, wait_ready


def _flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_rocm_mi300x_tensor_parallel() -> None:
    launch = build_launch(
        LaunchSpec(
            vendor="amd",
            accelerator="mi300x",
            model="meta-llama/Llama-3.1-70B-Instruct",
            tensor_parallel_size=2,
            max_model_len=32768,
            port=8001,
            host="0.0.0.0",
        )
    )
    assert launch.argv[:3] == ("vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct")
    assert _flag(launch.argv, "--tensor-parallel-size") == "2"
    assert _flag(launch.argv, "--max-model-len") == "32768"
    assert _flag(launch.argv, "--port") == "8001"
    assert launch.env["VLLM_ROCM_USE_AITER"] == "1"
    assert launch.env["HIP_VISIBLE_DEVICES"] == "0,1"
    assert launch.env["NCCL_MIN_NCHANNELS"] == "112"
    assert "CUDA_VISIBLE_DEVICES" not in launch.env
    assert launch.url == "http://127.0.0.1:8001"


def test_rocm_single_gpu_has_no_rccl_tuning_and_defaults_to_mi300x() -> None:
    launch = build_launch(LaunchSpec(vendor="amd", model="m", devices=[3]))
    assert launch.env["HIP_VISIBLE_DEVICES"] == "3"
    assert "NCCL_MIN_NCHANNELS" not in launch.env
    assert "--max-model-len" not in launch.argv


def test_cuda_h100() -> None:
    launch = build_launch(
        LaunchSpec(
            vendor="nvidia",
            accelerator="h100",
            model="m",
            served_model_name=["llama-3.1-8b"],
            tensor_parallel_size=1,
            max_model_len=8192,
            max_num_seqs=128,
            gpu_memory_utilization=0.85,
        )
    )
    assert launch.argv[:3] == ("vllm", "serve", "m")
    assert launch.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0"}
    assert _flag(launch.argv, "--served-model-name") == "llama-3.1-8b"
    assert _flag(launch.argv, "--max-num-seqs") == "128"
    assert _flag(launch.argv, "--gpu-memory-utilization") == "0.85"
    assert not any(k.startswith(("VLLM_ROCM", "HIP_")) for k in launch.env)


def test_cpu_fast_start() -> None:
    launch = build_launch(
        LaunchSpec(vendor="cpu", model="/m", python="/venv/bin/python", port=9000, max_num_seqs=2)
    )
    assert launch.argv[:5] == (
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/m",
    )
    assert {"--enforce-eager"} <= set(launch.argv)
    assert _flag(launch.argv, "--distributed-executor-backend") == "uni"
    assert _flag(launch.argv, "--dtype") == "bfloat16"
    assert _flag(launch.argv, "--max-model-len") == "512"
    assert _flag(launch.argv, "--kv-cache-memory-bytes") == "256M"
    assert _flag(launch.argv, "--max-num-seqs") == "2"
    assert _flag(launch.argv, "--host") == "127.0.0.1"
    assert launch.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert launch.env["VLLM_HOST_IP"] == "127.0.0.1"
    assert launch.env["HF_HUB_OFFLINE"] == launch.env["TRANSFORMERS_OFFLINE"] == "1"


def test_extra_args_and_env_come_last_and_api_key_is_hidden() -> None:
    launch = build_launch(
        LaunchSpec(
            vendor="nvidia",
            model="m",
            env={"CUDA_VISIBLE_DEVICES": "5"},
            extra_args=("--enable-prefix-caching",),
            api_key="sk-secret",
        )
    )
    assert launch.argv[-1] == "--enable-prefix-caching"
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "5"
    assert launch.env["VLLM_API_KEY"] == "sk-secret"
    assert "sk-secret" not in launch.shell() and "sk-secret" not in launch.env_file()
    assert "sk-secret" not in " ".join(launch.argv)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (LaunchSpec(vendor="amd", accelerator="h100", model="m"), "not a ROCm GPU"),
        (LaunchSpec(vendor="nvidia", accelerator="mi300x", model="m"), "not a CUDA GPU"),
        (LaunchSpec(vendor="cpu", model="m", tensor_parallel_size=2), "tensor parallel size 1"),
        (LaunchSpec(vendor="amd", model="m", tensor_parallel_size=2, devices=[0]), "1 devices"),
        (LaunchSpec(vendor="nvidia", model="m", port=0), "out of range"),
        (LaunchSpec(vendor="gpu", model="m"), "vendor must be"),  # type: ignore[arg-type]
    ],
)
def test_bad_specs(spec: LaunchSpec, message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        build_launch(spec)


def test_cli_print(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--vendor", "amd", "--accelerator", "mi300x", "--model", "x", "--tp", "4", "--print"]
    code = main([*args, "--", "--enable-chunked-prefill"])
    assert code == 0
    words = shlex.split(capsys.readouterr().out)
    assert "VLLM_ROCM_USE_AITER=1" in words and "HIP_VISIBLE_DEVICES=0,1,2,3" in words
    command = words[words.index("vllm") :]
    assert command[:3] == ["vllm", "serve", "x"] and command[-1] == "--enable-chunked-prefill"


def test_cli_env_file_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--vendor", "nvidia", "--accelerator", "h200", "--model", "x", "--env-file"]) == 0
    assert capsys.readouterr().out.splitlines() == ["CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=0"]
    assert main(["--vendor", "nvidia", "--accelerator", "mi300x", "--model", "x"]) == 2
    assert "not a CUDA GPU" in capsys.readouterr().err


def test_module_runs_as_a_script() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "backends.launcher", "--vendor", "cpu", "--model", "/m", "--print"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert "vllm.entrypoints.openai.api_server" in result.stdout


def test_wait_ready_reports_the_log_tail_of_a_dead_server(tmp_path: Path) -> None:
    launch = build_launch(LaunchSpec(vendor="cpu", model="/m", port=9))
    fake = type(launch)(
        argv=(sys.executable, "-c", "print('boom: no such model'); raise SystemExit(3)"),
        env={},
        url=launch.url,
    )
    process = start(fake, tmp_path / "server.log")
    try:
        with pytest.raises(RuntimeError, match=r"exited with 3(.|\n)*boom: no such model"):
            wait_ready(fake.url, process, tmp_path / "server.log", timeout=10)
    finally:
        stop(process)
