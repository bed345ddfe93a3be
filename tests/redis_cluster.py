"""A real three-node Redis Cluster on loopback for the tests (`redis-server` 7, no replicas).

The nodes die with the process that started them (PR_SET_PDEATHSIG) and are killed, with their folder,
when the context ends, whatever happened inside it.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.crc import key_slot

from backends.lifetime import die_with_parent

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
BUS_OFFSET = 10000
"""A cluster node also listens on its port + 10000 (the cluster bus)."""


@dataclass
class RedisCluster:
    ports: list[int]
    folder: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        """What an operator writes: `redis+cluster://` and a startup node (the rest is discovered)."""
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=5)

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.ports[0], socket_timeout=5)

    def owner(self, slot: int) -> int:
        """The port of the node serving `slot`."""
        for start, end, primary, *_ in self.node(self.ports[0]).execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
        raise LookupError(slot)

    def move_slot(self, slot: int, to_port: int) -> None:
        """Migrate `slot` and its keys to the node on `to_port` (what `redis-cli --cluster reshard` does
        for one slot): SETSLOT IMPORTING/MIGRATING, MIGRATE the keys, SETSLOT NODE on every node."""
        source_port = self.owner(slot)
        if source_port == to_port:
            return
        source, target = self.node(source_port), self.node(to_port)
        source_id = source.execute_command("CLUSTER", "MYID").decode()
        target_id = target.execute_command("CLUSTER", "MYID").decode()
        target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        while keys := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            source.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys)
        for port in self.ports:
            self.node(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        _wait(lambda: all(self._sees(port, slot, to_port) for port in self.ports), "slot moved")

    def _sees(self, port: int, slot: int, owner: int) -> bool:
        for start, end, primary, *_ in self.node(port).execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1]) == owner
        return False

    def slot_keys(self, pattern: str) -> dict[int, list[bytes]]:
        """Every key matching `pattern` on every node, by slot."""
        found: dict[int, list[bytes]] = {}
        for port in self.ports:
            for key in self.node(port).scan_iter(match=pattern, count=1000):
                found.setdefault(key_slot(key), []).append(key)
        return found


def _within(ready: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError, OSError):
            if ready():  # type: ignore[operator]
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _wait(ready: object, what: str, timeout: float = 20.0) -> None:
    if not _within(ready, timeout):
        raise RuntimeError(f"Redis Cluster: {what} not within {timeout} s")


def _free_ports(count: int) -> list[int]:
    """`count` ports free both as client ports and as cluster bus ports (port + 10000), all below the
    ephemeral range (32768 and up), so no outgoing connection takes one between this check and its use."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(10000, 22700 - count)
        wanted = [base + i for i in range(count)] + [base + i + BUS_OFFSET for i in range(count)]
        sockets: list[socket.socket] = []
        try:
            for port in wanted:
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return wanted[:count]
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no {count} free port pairs found")


class _NodeExited(Exception):
    pass


def _start_nodes(cluster: RedisCluster) -> bool:
    """Start a node per port; False (nodes killed) if one exits: a port was taken after all."""
    folder = cluster.folder
    for i, port in enumerate(cluster.ports):
        log = (folder / f"node-{i}.log").open("wb")
        command = [
            REDIS_SERVER,
            "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
            "--cluster-enabled", "yes", "--cluster-config-file", str(folder / f"nodes-{i}.conf"),
            "--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no",
        ]  # fmt: skip
        cluster.processes.append(
            subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent())
        )
        log.close()
    for i, (port, process) in enumerate(zip(cluster.ports, cluster.processes, strict=True)):

        def up(p: int = port, proc: subprocess.Popen[bytes] = process) -> bool:
            if proc.poll() is not None:
                raise _NodeExited(p)
            return bool(cluster.node(p).ping())

        try:
            if not _within(up, 20.0):
                log_text = (folder / f"node-{i}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"Redis Cluster: node {port} not up within 20 s; its log:\n{log_text}")
        except _NodeExited:
            _stop(cluster)
            return False
    return True


def _stop(cluster: RedisCluster) -> None:
    for process in cluster.processes:
        process.kill()
    for process in cluster.processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
    cluster.processes.clear()


@contextlib.contextmanager
def redis_cluster(nodes: int = 3, under: Path | None = None) -> Iterator[RedisCluster]:
    """`under`: where the nodes' folder goes (pytest's temporary tree, which pytest prunes, so even a
    killed session leaves no folder behind for long); the system's temporary folder by default."""
    folder = Path(tempfile.mkdtemp(prefix="sy-redis-cluster-", dir=under))
    cluster = RedisCluster(_free_ports(nodes), folder)
    try:
        for _ in range(3):
            if _start_nodes(cluster):
                break
            cluster.ports = _free_ports(nodes)
        else:
            raise RuntimeError("Redis Cluster: nodes kept exiting at start (ports taken?)")
        addresses = [f"127.0.0.1:{port}" for port in cluster.ports]
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=30,
        )

        def ok() -> bool:
            return all(
                b"cluster_state:ok" in cluster.node(p).execute_command("CLUSTER", "INFO")
                for p in cluster.ports
            )

        _wait(ok, "cluster_state:ok")
        yield cluster
    finally:
        _stop(cluster)
        shutil.rmtree(folder, ignore_errors=True)
