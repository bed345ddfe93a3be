"""A vLLM server the project starts (backends/server_process.py) ends with the process that started it,
SIGKILLed included, and so does its engine: vLLM's EngineCore is the server's child, and outlives a server
that is itself SIGKILLed (vllm-project/vllm#55510). The server gets SIGTERM when its parent dies, which
vLLM answers by stopping its engine; this holds it to that."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support import holding_server, session_processes
from tests.vllm.conftest import MAX_MODEL_LEN, MODEL, READY_TIMEOUT, _model, _python

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from backends.launcher import LaunchSpec, build_launch
    from backends.server_process import start, wait_ready
    from tests.support import free_port
    python, model, name, max_len, log, timeout = sys.argv[1:7]
    spec = LaunchSpec(vendor="cpu", model=model, served_model_name=[name], python=python, port=free_port(),
                      max_model_len=int(max_len), env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"})
    launch = build_launch(spec)
    server = start(launch, Path(log))
    wait_ready(launch.url, server, Path(log), float(timeout))
    print(server.pid, flush=True)
    time.sleep(3600)
    """
)


def test_a_killed_launcher_leaves_no_vllm_process(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    argv = [_python(), _model(), MODEL, str(MAX_MODEL_LEN), str(log), str(READY_TIMEOUT)]
    with holding_server(_HOLDER, *argv) as holder:
        server = holder.started()
        assert server, "the server did not start; its log: " + (
            log.read_text()[-2000:] if log.exists() else ""
        )
        names = list(session_processes(server).values())
        assert "VLLM::EngineCor" in names, names  # `comm` keeps 15 characters
        assert holder.left_after_sigkill(60) == {}
