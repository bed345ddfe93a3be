"""A lean Redis client for the hot path's one kind of call: `EVALSHA` of a Lua script, pipelined on one
connection.

redis-py costs tens of microseconds of Python per call (packing every argument, the pool, the retry
wrapper, the reply parser); under load that was most of what keys and limits cost. Here the caller hands
over arguments already encoded (what is the same for every request of a key is encoded once), and the
parser knows just what scripts answer: bulk strings, integers, arrays and errors.

NOSCRIPT (Redis restarted or flushed its scripts) resends the call as `EVAL`, which loads the script. A
lost connection is redialled once for the calls it had in flight (as the redis-py client this replaces
retried once); a call not answered within `timeout_s` fails with TimeoutError and the connection is
dropped (answers after it could no longer be matched to their calls).

On a Redis Cluster (`cluster_slot` set: the slot of the caller's hash tag) each dial first asks a node
for the slot map (`CLUSTER SLOTS`, see `cluster_slots.py`) and connects to the slot's primary. A call
answered with a redirection (MOVED, or "non local key": the script named no key, so Redis cannot send
MOVED) is sent again once the connection has been redialled to the slot's current owner; ASK, TRYAGAIN
and CLUSTERDOWN (a slot being migrated, a failover) are retried on the same node after a short pause,
until the call's timeout. Single-node mode pays none of this: only error replies are inspected.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from gateway.redis.cluster_slots import Address, is_redirect, is_stale_node, slot_owner
from gateway.redis.resp import (
    INCOMPLETE,
    OnReply,
    Reply,
    ScriptReplyError,
    bulk,
    bulk_int,
    command,
    parse,
)

__all__ = ["ScriptClient", "ScriptReplyError", "bulk", "bulk_int"]


class _Call:
    __slots__ = ("argc", "body", "deadline", "evaled", "numkeys", "on_reply", "redialled", "timer")

    def __init__(self, argc: int, body: bytes, numkeys: int, on_reply: OnReply) -> None:
        self.argc, self.body, self.numkeys, self.on_reply = argc, body, numkeys, on_reply
        self.timer: asyncio.TimerHandle | None = None
        self.evaled = False
        self.redialled = False

    deadline: float
    """Cluster only: when redirections stop being retried; unset until the first one."""


class ScriptClient(asyncio.Protocol):
    def __init__(
        self,
        script: str,
        *,
        host: str = "127.0.0.1",
        port: int = 6379,
        path: str | None = None,
        ssl: bool = False,
        username: str | None = None,
        password: str | None = None,
        db: int = 0,
        timeout_s: float = 1.0,
        cluster_slot: int | None = None,
        seeds: tuple[Address, ...] = (),
    ) -> None:
        self._script = script.encode()
        self._sha = hashlib.sha1(self._script).hexdigest().encode()
        self._address = (host, port, path, ssl)
        self._hello: list[bytes] = []
        if password:
            self._hello.append(command("AUTH", *([username] if username else []), password))
        if db:
            self._hello.append(command("SELECT", db))
        self._timeout = timeout_s
        self._transport: asyncio.Transport | None = None
        self._dialling: asyncio.Task[None] | None = None
        self._queued: list[_Call] = []
        self._sent: deque[_Call] = deque()
        self._buffer = bytearray()
        self._closed = False
        self._slot = cluster_slot
        self._seeds = seeds
        self._known: list[Address] = []
        """Cluster: every node of the last slot map (asked after the seeds, which may all be gone)."""
        self._stale = False
        """Cluster: the connection is to a node that no longer owns the slot (redial once drained)."""
        self._dialled = False

    @classmethod
    def like(cls, client: Any, script: str, timeout_s: float, tag: str) -> ScriptClient:
        """A client to the Redis that `client` (redis-py's asyncio client) talks to; on a cluster, to the
        node that owns hash tag `tag` (e.g. `{syt:prefix}`: every key the script touches has it)."""
        if isinstance(client, RedisCluster):
            kw = client.connection_kwargs
            nodes = client.nodes_manager.startup_nodes.values()
            return cls(
                script,
                ssl="SSL" in kw["connection_class"].__name__,
                username=kw.get("username"),
                password=kw.get("password"),
                timeout_s=timeout_s,
                cluster_slot=key_slot(tag.encode()),
                seeds=tuple((n.host, int(n.port)) for n in nodes),
            )
        pool = client.connection_pool
        kw = pool.connection_kwargs
        return cls(
            script,
            host=kw.get("host", "127.0.0.1"),
            port=int(kw.get("port", 6379)),
            path=kw.get("path"),
            ssl="SSL" in pool.connection_class.__name__,
            username=kw.get("username"),
            password=kw.get("password"),
            db=int(kw.get("db") or 0),
            timeout_s=timeout_s,
        )

    # --- calls -----------------------------------------------------------------------------------------

    def call(self, argc: int, body: bytes, on_reply: OnReply, numkeys: int = 0) -> None:
        """Run the script with `argc` arguments (keys then args), `body` their RESP encoding; `on_reply`
        gets the answer or the exception, once, from the event loop."""
        call = _Call(argc, body, numkeys, on_reply)
        if self._transport is not None and not self._stale:
            self._write(call)
        else:
            self._queue(call)

    def _queue(self, call: _Call) -> None:
        self._queued.append(call)
        if self._dialling is None and self._transport is None:
            self._queue_dial()

    def _queue_dial(self) -> None:
        self._dialling = asyncio.get_running_loop().create_task(self._dial())

    def _write(self, call: _Call) -> None:
        if call.evaled:
            head = b"*%d\r\n$4\r\nEVAL\r\n" % (call.argc + 3) + bulk(self._script)
        else:
            head = b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n" % (call.argc + 3, self._sha)
        transport = self._transport
        assert transport is not None  # calls are written once connected, the rest are queued
        transport.write(head + bulk_int(call.numkeys) + call.body)
        call.timer = asyncio.get_running_loop().call_later(self._timeout, self._timed_out, call)
        self._sent.append(call)

    def _timed_out(self, call: _Call) -> None:
        call.timer = None
        if call in self._sent:
            self._sent.remove(call)
            call.on_reply(TimeoutError(f"Redis did not answer within {self._timeout}s"))
            if self._transport is not None:
                self._transport.abort()

    # --- the connection --------------------------------------------------------------------------------

    async def _dial(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout):
                if self._slot is not None:
                    owner, known = await slot_owner(self._slot, self._candidates(), self._hello, self._ssl)
                    self._address, self._known = (*owner, None, self._ssl), known
                host, port, path, ssl = self._address
                if path:
                    await loop.create_unix_connection(lambda: self, path)
                else:
                    await loop.create_connection(lambda: self, host, port, ssl=ssl or None)
                for hello in self._hello:
                    answered: asyncio.Future[Reply] = loop.create_future()
                    self._handshake(hello, answered)
                    reply = await answered
                    if isinstance(reply, BaseException):
                        raise reply
        except BaseException as exc:
            if self._transport is not None:
                self._transport.abort()
            self._transport = None
            queued, self._queued = self._queued, []
            failure = exc if isinstance(exc, Exception) else ConnectionError("closed")
            for call in queued:
                call.on_reply(failure)
            if not isinstance(exc, Exception):
                raise
        else:
            queued, self._queued = self._queued, []
            for call in queued:
                self._write(call)
        finally:
            self._dialling = None

    @property
    def _ssl(self) -> bool:
        return self._address[3]

    def _candidates(self) -> list[Address]:
        """Where to ask for the slot map: the last owner first, then the configured startup nodes, then
        every other node of the last map."""
        first = [(self._address[0], self._address[1])] if self._dialled else []
        return list(dict.fromkeys([*first, *self._seeds, *self._known]))

    def _handshake(self, command: bytes, answered: asyncio.Future[Reply]) -> None:
        def done(reply: Reply | BaseException) -> None:
            if not answered.done():
                answered.set_result(reply)

        call = _Call(0, b"", 0, done)
        transport = self._transport
        assert transport is not None  # the handshake runs from connection_made on
        transport.write(command)
        self._sent.append(call)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # typeshed types the argument BaseTransport for every protocol; a TCP connection's is a Transport
        self._transport = transport  # type: ignore[assignment]
        self._buffer.clear()
        self._stale = False
        self._dialled = True

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._buffer.clear()
        lost, self._sent = self._sent, deque()
        for call in lost:
            if call.timer is not None:
                call.timer.cancel()
                call.timer = None
            if call.redialled or self._closed or not call.argc:
                call.on_reply(ConnectionError(f"connection to Redis lost: {exc or 'closed by Redis'}"))
            else:
                call.redialled = True
                self._queue(call)
        if self._queued and self._dialling is None and not self._closed:
            self._queue_dial()

    def data_received(self, data: bytes) -> None:
        buf = self._buffer
        buf += data
        pos, sent = 0, self._sent
        while sent:
            parsed = parse(buf, pos)
            if parsed is INCOMPLETE:
                break
            reply, pos = parsed
            call = sent.popleft()
            if call.timer is not None:
                call.timer.cancel()
                call.timer = None
            if isinstance(reply, ScriptReplyError) and call.argc:
                if not call.evaled and str(reply).startswith("NOSCRIPT"):
                    call.evaled = True
                    self._write(call)
                    continue
                if self._slot is not None and self._redirected(call, reply):
                    continue
            call.on_reply(reply)
        if pos:
            del buf[:pos]
        if self._stale and not sent and self._transport is not None:
            self._transport.close()  # connection_lost redials, to the slot's owner, for what waits

    def _redirected(self, call: _Call, reply: ScriptReplyError) -> bool:
        """Cluster: if `reply` says the slot is elsewhere or busy, send `call` again (True) unless its
        time is up. Redis refuses a script at its first access to a key it does not serve, so a refused
        call did nothing, except in the instant the slot is being migrated (some of its keys moved, not
        all), where the writes before that access stand and the call's settlements may count twice."""
        text = str(reply)
        if not is_redirect(text):
            return False
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = getattr(call, "deadline", None)
        if deadline is None:
            call.deadline = now + self._timeout
        elif now > deadline:
            return False
        if is_stale_node(text):
            self._stale = True
            self._queued.append(call)
        else:  # ASK, TRYAGAIN, CLUSTERDOWN: the slot is moving or the cluster is failing over
            loop.call_later(0.02, self._again, call)
        return True

    def _again(self, call: _Call) -> None:
        if self._closed:
            call.on_reply(ConnectionError("closed"))
        elif self._transport is not None and not self._stale:
            self._write(call)
        else:
            self._queue(call)

    async def close(self) -> None:
        self._closed = True
        if self._dialling is not None:
            self._dialling.cancel()
        if self._transport is not None:
            self._transport.close()
