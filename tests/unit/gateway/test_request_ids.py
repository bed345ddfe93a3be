"""Request ids the gateway makes: the ledger's idempotency key, so they must be unguessable and unique."""

from __future__ import annotations

import os

from gateway.http.routes import new_request_id, read_caller


def test_request_ids_are_128_random_bits_never_repeated_even_across_a_fork() -> None:
    first = new_request_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child's next id must not be the parent's next one
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    ids = {first, child, *(new_request_id() for _ in range(1000))}
    assert len(ids) == 1002 and all(i.startswith("req-") and len(i) == 36 for i in ids)
    assert all(int(i[4:], 16) >= 0 for i in ids)


def test_a_client_request_id_is_kept_apart_and_never_becomes_the_ledger_id() -> None:
    caller = read_caller({"headers": [(b"x-request-id", b"my-id-1")]})
    assert caller.client_request_id == "my-id-1" and caller.request_id.startswith("req-")
    assert caller.forwarded["x-request-id"] == caller.request_id
    bad = read_caller({"headers": [(b"x-request-id", b"x" * 129)]})  # too long: ignored
    assert bad.client_request_id is None and bad.request_id.startswith("req-")
