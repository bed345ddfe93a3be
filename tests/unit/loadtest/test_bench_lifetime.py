"""What the benchmarks start stops with the bench, however it ends: SIGKILLed, it leaves no process of the
servers it started behind, grandchildren included (nginx's worker lived on once its master died with the
bench, as did granian's worker process)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from loadtest.bench._util import which
from loadtest.bench.http_clients.upstream import _nginx_conf
from loadtest.bench.stream_upstream import ECHO_MODULE
from tests.support import holding_server, session_processes

NGINX = which("nginx", "/usr/sbin", "/usr/local/sbin")

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from loadtest.processes import ProcessGroup
    work = Path(sys.argv[2])
    group = ProcessGroup(work)
    if sys.argv[1] == "static":
        from loadtest.bench.http_clients.upstream import start_upstream
        pid = start_upstream(group, "nginx", 0, work).child.pid
    elif sys.argv[1] == "granian":
        import os, urllib.error, urllib.request
        from loadtest.bench.http_clients.proxy import proxy_argv
        from loadtest.processes import free_port
        port, unused = free_port(), "http://127.0.0.1:9"
        env = {**os.environ, "BENCH_CLIENT": "httpx", "BENCH_CONNECTIONS": "8"}
        env.update(BENCH_UPSTREAM_JSON=unused, BENCH_UPSTREAM_STREAM=unused)
        pid = group.start("granian", proxy_argv("granian", port), cpu=0, env=env).pid
        for _ in range(300):  # until its worker answers: the app, and what it set up, is loaded
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                time.sleep(0.1)
    else:
        from loadtest.bench.stream_upstream import start_nginx
        start_nginx(group, work, 0, 1.0)
        pid = group.children[-1].pid
    print(pid, flush=True)
    time.sleep(120)
    """
)


def test_the_static_upstream_is_one_nginx_process() -> None:
    conf = _nginx_conf(Path("/tmp/x"), 1, 2)
    assert "master_process off;" in conf and "daemon off;" in conf


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (make bench-* installs it)")
@pytest.mark.parametrize("upstream", ["static", "streaming"])
def test_a_killed_bench_leaves_no_nginx_running(upstream: str, tmp_path: Path) -> None:
    if upstream == "streaming" and not ECHO_MODULE.exists():
        pytest.skip("nginx's echo module is not installed (make bench-stream-chunks installs it)")
    _kill_and_check(upstream, tmp_path, processes=1)


def test_a_killed_bench_leaves_no_granian_worker_running(tmp_path: Path) -> None:
    _kill_and_check("granian", tmp_path, processes=2)  # granian's main process and its worker


def _kill_and_check(server: str, tmp_path: Path, processes: int) -> None:
    """Start `server` from a bench process, SIGKILL that process, and wait for every process of the
    server's session to end; `processes`: how many the session held before."""
    with holding_server(_HOLDER, server, str(tmp_path)) as holder:
        leader = holder.started()
        assert len(session_processes(leader)) == processes  # the server leads a session of its own
        assert holder.left_after_sigkill(10) == {}
