"""Set-up every Python process of a CPU vLLM server needs before vLLM starts: the AMX tile state, and
which cores it runs on. The launcher puts this directory on the CPU server's PYTHONPATH, and Python
imports `sitecustomize` at start-up, in the API server and in every process it spawns (the CPU platform
forces spawn, which starts a new interpreter).

AMX: on an x86 CPU with AMX, vLLM's CPU build picks its AMX attention kernel for bfloat16
(`torch.cpu._is_amx_tile_supported()` reads CPUID), but nothing in the server asks the kernel for the
permission Linux (5.16 and later) wants before a process may touch the tile registers
(`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`). Without it the engine dies of SIGILL on its first
step. Where there is no AMX, or no such call, the request fails and nothing changes.

Cores (`SWITCHYARD_ENGINE_CPUS`, `SWITCHYARD_FRONT_CPUS`: lists such as "1" or "1,2,3"; unset: any): the
engine core, a spawned child, computes its steps, and the API server (the main process, with the
spawner's resource tracker) serves HTTP. vLLM 0.32 binds its compute threads only in its multiprocess
executor, not in the one-process one a single CPU server runs (`VLLM_CPU_OMP_THREADS_BIND` is then read
by nothing), so the binding that keeps the engine off the clients' core is made here, for every thread
the process will start.
"""

import contextlib
import ctypes
import os
import platform

SYS_ARCH_PRCTL = 158  # x86-64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

if platform.system() == "Linux" and platform.machine() == "x86_64":
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)


def _spawned() -> bool:
    """Whether this interpreter is a multiprocessing spawn child (vLLM's engine core is one)."""
    try:
        with open("/proc/self/cmdline", "rb") as cmdline:
            return b"spawn_main" in cmdline.read()
    except OSError:
        return False


def _bind() -> None:
    wanted = os.environ.get("SWITCHYARD_ENGINE_CPUS" if _spawned() else "SWITCHYARD_FRONT_CPUS", "")
    with contextlib.suppress(ValueError, OSError, AttributeError):
        cpus = {int(cpu) for cpu in wanted.split(",") if cpu.strip()}
        if cpus:
            os.sched_setaffinity(0, cpus)


_bind()
