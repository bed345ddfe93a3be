"""A real Redis Cluster on loopback for the tests (`redis-server` 7): three primaries, and optionally a
replica of each (for failover: `failover` for a manual `CLUSTER FAILOVER`, `kill` for a primary's death).

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
    node_timeout_ms: int = 2000
    """`cluster-node-timeout`: how long a primary may be silent before its replica takes over."""

    @property
    def url(self) -> str:
        """What an operator writes: `redis+cluster://` and a startup node (the rest is discovered)."""
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=5)

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.ports[0], socket_timeout=5)

    def alive(self) -> list[int]:
        """The ports of the nodes still running."""
        return [port for port, p in zip(self.ports, self.processes, strict=True) if p.poll() is None]

    def owner(self, slot: int) -> int:
        """The port of the node serving `slot`, as the first live node says."""
        return self._slot_row(self.alive()[0], slot)[0]

    def replica_of(self, slot: int) -> int:
        """The port of a replica of the node serving `slot`."""
        return self._slot_row(self.alive()[0], slot)[1][0]

    def owners(self) -> list[tuple[int, int, int]]:
        """(first slot, last slot, primary's port) for every range, as the first live node says."""
        with self.node(self.alive()[0]) as node:
            return [(int(a), int(b), int(p[1])) for a, b, p, *_ in node.execute_command("CLUSTER", "SLOTS")]

    def _slot_row(self, port: int, slot: int) -> tuple[int, list[int]]:
        with self.node(port) as node:
            rows = node.execute_command("CLUSTER", "SLOTS")
        for start, end, primary, *replicas in rows:
            if start <= slot <= end:
                return int(primary[1]), [int(r[1]) for r in replicas]
        raise LookupError(slot)

    def failover(self, slot: int) -> int:
        """A manual `CLUSTER FAILOVER` (no data lost: the primary pauses its clients until the replica has
        caught up) by the replica of the node serving `slot`; returns the new primary once every live node
        sees it."""
        replica = self.replica_of(slot)
        self.node(replica).execute_command("CLUSTER", "FAILOVER")
        _wait(lambda: all(self._slot_row(p, slot)[0] == replica for p in self.alive()), "failover")
        return replica

    def kill(self, port: int) -> None:
        """SIGKILL the node on `port` (its replica, if it has one, is promoted after the node timeout)."""
        process = self.processes[self.ports.index(port)]
        process.kill()
        process.wait(timeout=10)

    def promoted(self, slot: int, dead: int, timeout: float = 20.0) -> int:
        """Wait until every live node names a live primary other than `dead` for `slot`; its port."""

        def moved() -> bool:
            owners = {self._slot_row(p, slot)[0] for p in self.alive()}
            return len(owners) == 1 and dead not in owners

        _wait(moved, "promotion", timeout)
        return self.owner(slot)

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
        for port in {port for _, _, port in self.owners()} | {to_port}:  # primaries (replicas: gossip)
            self.node(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        _wait(lambda: all(self._sees(port, slot, to_port) for port in self.alive()), "slot moved")

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
            "--cluster-node-timeout", str(cluster.node_timeout_ms), "--save", "", "--appendonly", "no",
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


def _ready(node: redis.Redis, replicas: int) -> bool:
    """The node sees the cluster ok and every slot range with its replicas, and as a replica it has its
    primary's data."""
    with node:
        if b"cluster_state:ok" not in node.execute_command("CLUSTER", "INFO"):
            return False
        if any(len(row) < 3 + replicas for row in node.execute_command("CLUSTER", "SLOTS")):
            return False
        info = node.info("replication")
        return bool(info["role"] == "master" or info.get("master_link_status") == "up")


def _stop(cluster: RedisCluster) -> None:
    for process in cluster.processes:
        process.kill()
    for process in cluster.processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
    cluster.processes.clear()


@contextlib.contextmanager
def redis_cluster(
    nodes: int = 3, under: Path | None = None, replicas: int = 0, node_timeout_ms: int = 2000
) -> Iterator[RedisCluster]:
    """`nodes` primaries, each with `replicas` replicas. `under`: where the nodes' folder goes (pytest's
    temporary tree, which pytest prunes, so even a killed session leaves no folder behind for long); the
    system's temporary folder by default. `node_timeout_ms`: a primary silent this long is failed over."""
    folder = Path(tempfile.mkdtemp(prefix="sy-redis-cluster-", dir=under))
    nodes *= 1 + replicas
    cluster = RedisCluster(_free_ports(nodes), folder, node_timeout_ms=node_timeout_ms)
    try:
        for _ in range(3):
            if _start_nodes(cluster):
                break
            cluster.ports = _free_ports(nodes)
        else:
            raise RuntimeError("Redis Cluster: nodes kept exiting at start (ports taken?)")
        addresses = [f"127.0.0.1:{port}" for port in cluster.ports]
        create = [REDIS_CLI, "--cluster", "create", *addresses, "--cluster-replicas", str(replicas)]
        subprocess.run(
            [*create, "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=30,
        )

        def ok() -> bool:
            return all(_ready(cluster.node(p), replicas) for p in cluster.ports)

        _wait(ok, "cluster_state:ok")
        yield cluster
    finally:
        _stop(cluster)
        shutil.rmtree(folder, ignore_errors=True)
