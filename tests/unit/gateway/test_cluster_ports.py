"""A held port (backends/ports.py) is never another process's free-port pick, yet the server it was picked
for binds it; the cluster (gateway/cli/cluster.py) holds every port it picked from the moment it picks it."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import pytest

from backends.ports import port_of, reserve_port
from gateway.cli.cluster import Cluster


def _free_port_picks(count: int) -> set[int]:
    """What `bind(port 0)` hands out, as any other process's free_port() would get it."""
    picks = set()
    for _ in range(count):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            picks.add(port_of(sock))
    return picks


def _bind_error(port: int, reuse_address: bool) -> int | None:
    with socket.socket() as sock:
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError as exc:
            return exc.errno
    return None


def test_a_held_port_is_nobody_elses_pick_but_its_server_binds_it() -> None:
    with reserve_port() as held:
        port = port_of(held)
        # bind(0) picks at random among ~14,000 ports (Linux: the odd half of 32768-60999): 30,000 picks
        # give it every chance to hand out the held one.
        assert port not in _free_port_picks(30_000)
        assert _bind_error(port, reuse_address=False) == errno.EADDRINUSE
        # A server (uvicorn, redis-server, HAProxy all set SO_REUSEADDR) listens on it all the same, and
        # until one does a connection is refused, as on any closed port.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        with (
            socket.create_server(("127.0.0.1", port)) as server,
            socket.create_connection(("127.0.0.1", port), timeout=2),
        ):
            server.accept()[0].close()


def test_a_cluster_holds_its_ports_from_the_start_and_lets_them_go_when_stopped(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, replicas=2)
    try:
        picks = _free_port_picks(30_000)
        assert cluster.port not in picks and not set(cluster.replica_ports) & picks
        # The balancer's socket is already listening (HAProxy will serve on it): no other server can bind
        # it, even with SO_REUSEADDR.
        assert _bind_error(cluster.port, reuse_address=True) == errno.EADDRINUSE
        held = [_bind_error(port, reuse_address=False) for port in cluster.replica_ports]
        assert held == [errno.EADDRINUSE] * len(held)
    finally:
        cluster.stop()
    assert _bind_error(cluster.port, reuse_address=True) is None
    assert all(_bind_error(port, reuse_address=True) is None for port in cluster.replica_ports)
