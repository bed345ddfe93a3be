"""The benchmarks' nginx upstreams stop with the bench, however it ends: SIGKILLed, it leaves no nginx
process behind (with a master process, the master died with the bench and its worker lived on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from loadtest.bench._util import which
from loadtest.bench.http_clients.upstream import _nginx_conf
from loadtest.bench.stream_upstream import ECHO_MODULE

ROOT = Path(__file__).resolve().parents[3]
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
    else:
        from loadtest.bench.stream_upstream import start_nginx
        start_nginx(group, work, 0, 1.0)
        pid = group.children[-1].pid
    print(pid, flush=True)
    time.sleep(120)
    """
)


def _session_members(session: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] != "Z":  # field 6 of stat: the session id
            members.append(int(entry.name))
    return members


def test_the_static_upstream_is_one_nginx_process() -> None:
    conf = _nginx_conf(Path("/tmp/x"), 1, 2)
    assert "master_process off;" in conf and "daemon off;" in conf


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (make bench-* installs it)")
@pytest.mark.parametrize("upstream", ["static", "streaming"])
def test_a_killed_bench_leaves_no_nginx_running(upstream: str, tmp_path: Path) -> None:
    if upstream == "streaming" and not ECHO_MODULE.exists():
        pytest.skip("nginx's echo module is not installed (make bench-stream-chunks installs it)")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, upstream, str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    nginx = 0
    try:
        assert holder.stdout is not None
        nginx = int(holder.stdout.readline())
        assert nginx in _session_members(nginx)  # nginx leads a session of its own
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _session_members(nginx) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _session_members(nginx) == []
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        for pid in _session_members(nginx) if nginx else []:
            os.kill(pid, signal.SIGKILL)  # what a failed run left
