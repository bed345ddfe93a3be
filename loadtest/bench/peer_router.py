"""vllm-router, the Rust router, as a third target beside two gateway trees in a benchmark's rounds.

It is started as the side-by-side peers harness's `vllm-router` preset starts it (the harness's `setup.sh`
installs it under /tmp/peers-venvs): one router per upstream, since it balances over its workers and does
not route by model.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from loadtest.bench._util import start_per_shape
from loadtest.processes import Child, ProcessGroup, free_port

PEER = "/tmp/peers-venvs/vllm-router/bin/vllm-router"
"""Where the peers harness's `setup.sh` installs vllm-router."""


def router_argv(binary: str, port: int, worker_url: str) -> list[str]:
    """vllm-router on loopback `port` in front of `worker_url`, as the peers harness's preset starts it
    (its metrics on a free port of their own)."""
    return [
        binary,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        worker_url,
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(free_port()),
    ]


def start_peers(
    group: ProcessGroup,
    binary: str,
    upstreams: dict[str, str],
    shapes: list[str],
    answers: Callable[[str, str], bool],
    cpu: int,
) -> dict[str, tuple[str, Child]]:
    """One vllm-router per upstream shape; {shape: (URL, child)} once `answers(url, shape)` holds for each."""
    return start_per_shape(group, "peer", partial(router_argv, binary), upstreams, shapes, answers, cpu)
