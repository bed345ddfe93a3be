"""A server that gives the CPU to the clients measuring it when both run on one machine.

vLLM's engine process waits for its worker by spinning (`sched_yield` for a second after each step), and
the CPU build's worker computes on the cores it is given. A client on the same machine, as in CI's
calibration proof, can then wait on the run queue for seconds while the server's answer sits in its socket:
runs of sixteen streams on the 2-core CI machine spent 1.4-4.9 s of 1.7-5.3 s runnable but not running,
and read every token at once (docs/calibrate.md). Its timings are then the machine's, not the server's.

Linux shares the CPU between sessions first (autogroups) and only then between the processes of a session,
so a nice value alone does not help a client in another session: the server's session gets a lower weight
as well. How much lower was measured (docs/calibrate.md): at nice 1 or 2 one run in eight still starved
the client for a second; at 19 a busy process beside the client doubled the server's inter-token latency
(7.7 against 3.5 ms); at 5 neither happened in 18 runs. In a real deployment the clients are other
machines and none of this is needed.

The CPU build's compute threads are the other half (`compute_apart`): by default it runs one OpenMP
thread on every core, and each step waits for the slowest of them, so any client, gateway or simulator
scheduled on one of those cores stalls the whole step. On the 2-core machine, one thread bound to the
second core made steps a third shorter and their spread from one level to the next far smaller; the
first core is left to the clients and to the server's API process (docs/calibrate.md). vLLM 0.32's
one-process server reads no binding of its own, so backends/cpu_site makes it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

NICE = 5
"""The server's nice value, and its session's: below its clients, not so far below that they starve it."""
AUTOGROUP = "/proc/self/autogroup"


def below_clients() -> None:
    """Put the calling process, and its session's autogroup, at nice `NICE`.

    Call it in a process that leads its own session (a `start_new_session` child, before it execs the
    server): the autogroup's weight is the whole session's. Raising a nice value needs no privilege.
    """
    os.setpriority(os.PRIO_PROCESS, 0, NICE)
    # a kernel without autogroups has no such file
    with contextlib.suppress(OSError), open(AUTOGROUP, "w") as group:
        group.write(str(NICE))


def autogroup_nice(pid: int) -> int | None:
    """The nice value of `pid`'s autogroup (None without autogroups)."""
    try:
        with open(f"/proc/{pid}/autogroup") as group:
            return int(group.read().rsplit("nice", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


def compute_apart(cpus: Iterable[int] | None = None) -> dict[str, str]:
    """The CPU build's environment that keeps its compute threads off the first of `cpus` (default: the
    ones this process may run on), one bound thread per other CPU; nothing with fewer than two."""
    allowed = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if len(allowed) < 2:
        return {}
    first, rest = allowed[:1], allowed[1:]
    return {
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, rest)),
        "OMP_NUM_THREADS": str(len(rest)),
        # what binds them in a one-process server (backends/cpu_site), and its HTTP on the clients' core
        "SWITCHYARD_ENGINE_CPUS": ",".join(map(str, rest)),
        "SWITCHYARD_FRONT_CPUS": ",".join(map(str, first)),
    }


@contextlib.contextmanager
def on_clients_core(cpus: Iterable[int] | None = None) -> Iterator[None]:
    """Runs the calling thread, and every process it starts meanwhile, on the first of `cpus` (default: the
    ones it may run on), the core `compute_apart` leaves to the clients; nothing with fewer than two.

    Linux moves a busy client or gateway to the engine's core when the first one is full, and the step it
    lands on waits for it: with sixteen streams through a gateway, whole pieces of the calibration proof's
    load ran 1.5 times slower than the rest, vLLM's own inter-token latency with them (docs/calibrate.md).
    """
    before = os.sched_getaffinity(0)
    allowed = sorted(before if cpus is None else cpus)
    if len(allowed) < 2:
        yield
        return
    os.sched_setaffinity(0, allowed[:1])
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
