"""Every Python process of a CPU server asks Linux for the AMX tile state (backends/cpu_site): without it
the CPU build's bfloat16 kernels die of SIGILL on an AMX machine."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from backends.launcher import CPU_SITE, LaunchSpec, build_launch

ARCH_GET_XCOMP_PERM = 0x1022
XTILEDATA = 1 << 18
PERMISSION = (
    "import ctypes; mask = ctypes.c_uint64(); "
    f"ctypes.CDLL(None).syscall(158, {ARCH_GET_XCOMP_PERM}, ctypes.byref(mask)); "
    "import sitecustomize; print(sitecustomize.__file__, mask.value)"
)


def _has_amx() -> bool:
    return "amx_tile" in Path("/proc/cpuinfo").read_text()


def test_a_cpu_servers_interpreters_import_the_amx_request() -> None:
    env = build_launch(LaunchSpec(vendor="cpu", model="m", python="py")).env
    assert env["PYTHONPATH"] == CPU_SITE
    assert (Path(CPU_SITE) / "sitecustomize.py").is_file()


@pytest.mark.skipif(platform.machine() != "x86_64" or platform.system() != "Linux", reason="x86-64 Linux")
def test_an_interpreter_started_with_the_site_may_use_amx_where_the_cpu_has_it() -> None:
    env = {**os.environ, "PYTHONPATH": CPU_SITE}
    command = [sys.executable, "-c", PERMISSION]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    path, mask = out.stdout.split()
    assert Path(path) == Path(CPU_SITE) / "sitecustomize.py"
    assert bool(int(mask) & XTILEDATA) == _has_amx()
    bare = subprocess.run(
        [sys.executable, "-S", "-c", PERMISSION.split("; import sitecustomize")[0] + "; print(mask.value)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert not int(bare.stdout) & XTILEDATA  # the permission is the site's doing, not the default


SPAWNS = """
import multiprocessing, os

def cpus():
    return sorted(os.sched_getaffinity(0))

if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        print(cpus(), pool.apply(cpus))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_engine_a_server_spawns_computes_on_its_own_cores_and_the_api_server_on_the_clients(
    tmp_path: Path,
) -> None:
    """vLLM 0.32's one-process CPU server binds no compute thread of its own: the site does, before the
    engine core (a spawned interpreter) starts a thread, and keeps the API server on the clients' core."""
    first, *rest = sorted(os.sched_getaffinity(0))
    script = tmp_path / "spawns.py"
    script.write_text(SPAWNS)
    env = {
        **os.environ,
        "PYTHONPATH": CPU_SITE,
        "SWITCHYARD_ENGINE_CPUS": ",".join(map(str, rest)),
        "SWITCHYARD_FRONT_CPUS": str(first),
    }
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"{[first]} {rest}"
    unbound = subprocess.run(
        [sys.executable, str(script)], env={**os.environ, "PYTHONPATH": CPU_SITE}, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    everything = sorted(os.sched_getaffinity(0))
    assert unbound.stdout.strip() == f"{everything} {everything}"  # nothing asked: nothing bound


@pytest.mark.parametrize("wanted", ["x,1", "999", " , "])
def test_a_list_that_names_no_usable_cpu_binds_nothing_and_breaks_nothing(
    wanted: str, tmp_path: Path
) -> None:
    script = tmp_path / "spawns.py"
    script.write_text(SPAWNS)
    env = {
        **os.environ,
        "PYTHONPATH": CPU_SITE,
        "SWITCHYARD_ENGINE_CPUS": wanted,
        "SWITCHYARD_FRONT_CPUS": wanted,
    }
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True)
    everything = sorted(os.sched_getaffinity(0))
    assert out.stdout.strip() == f"{everything} {everything}"
