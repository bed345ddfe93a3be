"""The hot path's lean Redis client (gateway/redis/script_client.py) against the real Redis: pipelined
calls answered in order, NOSCRIPT answered by EVAL, errors, a connection Redis closes, a Redis that does
not answer, one that cannot be reached."""

from __future__ import annotations

import asyncio
import socket
import uuid

import redis

from gateway.redis.script_client import ScriptClient, ScriptReplyError, bulk


def _echo_script() -> str:
    # A script no one loaded yet (the comment makes its SHA new): the first call meets NOSCRIPT.
    return f"-- {uuid.uuid4().hex}\nreturn {{KEYS[1] or '', table.concat(ARGV, ',')}}"


async def _call(client: ScriptClient, *args: str, numkeys: int = 0) -> object:
    answered: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    client.call(len(args), b"".join(bulk(a) for a in args), answered.set_result, numkeys=numkeys)
    return await answered


def test_pipelined_calls_are_answered_in_order_and_noscript_falls_back_to_eval() -> None:
    async def run() -> None:
        client = ScriptClient(_echo_script(), timeout_s=2.0)
        try:
            calls = [_call(client, "k", str(i), "x", numkeys=1) for i in range(50)]
            answers = await asyncio.gather(*calls)
            assert answers == [[b"k", f"{i},x".encode()] for i in range(50)]
            assert await _call(client, "a", "b") == [b"", b"a,b"]  # by SHA now
        finally:
            await client.close()

    asyncio.run(run())


def test_an_error_reply_is_given_to_the_call_and_the_connection_stays_usable() -> None:
    async def run() -> None:
        client = ScriptClient(f"-- {uuid.uuid4().hex}\nreturn redis.call('INCR', 'x', 'y')", timeout_s=2.0)
        echo = ScriptClient(_echo_script(), timeout_s=2.0)
        try:
            error = await _call(client, "z")
            assert isinstance(error, ScriptReplyError) and "ERR" in str(error)
            assert await _call(echo, "1") == [b"", b"1"]
        finally:
            await client.close()
            await echo.close()

    asyncio.run(run())


def test_a_connection_closed_by_redis_is_redialled() -> None:
    async def run() -> None:
        client = ScriptClient(_echo_script(), timeout_s=2.0)
        admin = redis.Redis()
        try:
            assert await _call(client, "a") == [b"", b"a"]
            host, port = client._transport.get_extra_info("sockname")[:2]  # type: ignore[union-attr]
            assert admin.client_kill(f"{host}:{port}")
            await asyncio.sleep(0.1)
            assert await _call(client, "b") == [b"", b"b"]
        finally:
            await client.close()
            admin.close()

    asyncio.run(run())


def test_a_redis_that_does_not_answer_times_out_and_one_unreachable_fails_at_once() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    port = silent.getsockname()[1]

    async def run() -> None:
        client = ScriptClient(_echo_script(), port=port, timeout_s=0.2)
        try:
            assert isinstance(await _call(client, "a"), TimeoutError)
        finally:
            await client.close()
        silent.close()
        refused = ScriptClient(_echo_script(), port=port, timeout_s=0.2)
        try:
            assert isinstance(await _call(refused, "a"), OSError)
        finally:
            await refused.close()

    try:
        asyncio.run(run())
    finally:
        silent.close()


def test_the_db_is_selected_first() -> None:
    shared = redis.Redis(db=1)
    name = "script-client-test-" + uuid.uuid4().hex

    async def run() -> None:
        client = ScriptClient(
            f"-- {uuid.uuid4().hex}\nreturn redis.call('SET', KEYS[1], '1')", db=1, timeout_s=2.0
        )
        try:
            assert await _call(client, name, numkeys=1) == b"OK"
        finally:
            await client.close()

    try:
        asyncio.run(run())
        assert shared.get(name) == b"1"
    finally:
        shared.delete(name)
        shared.close()


def test_a_wrong_password_fails_the_call() -> None:
    async def run() -> None:
        client = ScriptClient(_echo_script(), password="not-the-password", timeout_s=2.0)
        try:
            reply = await _call(client, "a")
            assert isinstance(reply, ScriptReplyError), reply
        finally:
            await client.close()

    asyncio.run(run())
