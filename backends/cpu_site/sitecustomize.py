"""Ask Linux for the AMX tile state in every Python process of a CPU vLLM server, before vLLM uses it.

On an x86 CPU with AMX, vLLM's CPU build picks its AMX attention kernel for bfloat16
(`torch.cpu._is_amx_tile_supported()` reads CPUID), but nothing in the server asks the kernel for the
permission Linux (5.16 and later) wants before a process may touch the tile registers
(`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`). Without it the engine dies of SIGILL on its first
step. The engine core is a spawned process (the CPU platform forces spawn), and spawn starts a new
interpreter, so the request must run in each interpreter: the launcher puts this directory on the CPU
server's PYTHONPATH, and Python imports `sitecustomize` at start-up. Where there is no AMX, or no such
call, the request fails and nothing changes.
"""

import contextlib
import ctypes
import platform

SYS_ARCH_PRCTL = 158  # x86-64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

if platform.system() == "Linux" and platform.machine() == "x86_64":
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
