"""Admissions that arrive in the same turn of the event loop go to Redis as one `limits.ADMIT` call.

Each request still waits for exactly one round trip (the one its batch makes), but the cost per call
(encoding, a write, parsing the answer) is paid once per batch instead of once per request. Arguments
are RESP-encoded here straight into the batch (`script_client`): a key's scope arguments once per minute
(`Tenants._prepare`), only tokens and cost per request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gateway.redis.script_client import ScriptClient, bulk
from gateway.tenants.settler import Settler

_MAX_BATCH = 256
_NO_SETTLEMENTS = bulk(0)


class AdmitBatcher:
    def __init__(
        self,
        client: ScriptClient,
        window_ms: int,
        replica: str,
        namespace: str,
        settler: Settler | None = None,
    ) -> None:
        self._client = client
        self._settler = settler
        """Its pending settlements ride along with each batch (`limits.ADMIT` applies them first)."""
        self._head = bulk(window_ms) + bulk(replica) + bulk(namespace)
        self._parts: list[bytes] = [self._head, _NO_SETTLEMENTS]
        self._argc = 4
        self._waiting: list[asyncio.Future[bytes]] = []
        self._orphans: dict[asyncio.Future[bytes], Callable[[bytes], None]] = {}
        """Admissions whose request was cancelled while in flight: what to do with their answer."""
        self.calls = 0
        """Round trips answered (or failed): each admitted or refused a batch."""
        self.requests = 0
        """Requests in those batches."""
        self.seconds = 0.0
        """Their time from the write to the answer, summed: every request of a batch waited for it."""

    def admit(self, tokens: int, cost: int, scopes: tuple[int, bytes, bytes]) -> asyncio.Future[bytes]:
        """The request's answer from `limits.ADMIT` (bytes), or the batch's exception. `scopes`: the
        request's scope arguments as `encode_scopes` gives them."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        waiting = self._waiting
        if not waiting:
            loop.call_soon(self._send)
        count, encoded_count, encoded = scopes
        # `bulk_int` of both numbers, written out: two calls less on every admission
        t, c = b"%d" % tokens, b"%d" % cost
        self._parts.append(b"%b$%d\r\n%b\r\n$%d\r\n%b\r\n%b" % (encoded_count, len(t), t, len(c), c, encoded))
        self._argc += 3 + count
        waiting.append(future)
        if len(waiting) >= _MAX_BATCH:
            self._send()
        return future

    def orphan(self, future: asyncio.Future[bytes], answered: Callable[[bytes], None]) -> None:
        """The request awaiting `future` was cancelled (its client left): `limits.ADMIT` may still admit
        it, so its answer goes to `answered` (which gives the reservation back) instead of being lost."""
        if future.done() and not future.cancelled():
            if future.exception() is None:
                answered(future.result())
            return
        self._orphans[future] = answered

    def _send(self) -> None:
        waiting = self._waiting
        if not waiting:
            return
        parts, argc = self._parts, self._argc
        self._parts, self._argc, self._waiting = [self._head, _NO_SETTLEMENTS], 4, []
        settler = self._settler
        settling = settler.take() if settler is not None else None
        if settling:
            parts[1] = bulk(len(settling))
            pairs = []
            for counter, delta in settling.items():
                d = b"%d" % delta
                pairs.append(b"%b$%d\r\n%b\r\n" % (counter, len(d), d))  # `bulk_int(delta)` after the name
            parts.insert(2, b"".join(pairs))
            argc += 2 * len(settling)
        body = b"".join(parts)
        started = time.monotonic()

        def answer(replies: object) -> None:
            self.calls += 1
            self.requests += len(waiting)
            self.seconds += time.monotonic() - started
            orphans = self._orphans
            if isinstance(replies, bytes):  # one line per request (`limits.ADMIT`)
                replies = replies.split(b"\n")
            failed = not isinstance(replies, list) or len(replies) != len(waiting)
            if failed and settling:
                assert settler is not None  # the settlements were taken from it
                settler.restore(settling)  # not known to be applied: again
            if failed:
                if not isinstance(replies, BaseException):
                    replies = RuntimeError(f"limits.ADMIT answered {str(replies)[:200]}")
                for future in waiting:
                    if not future.done():
                        future.set_exception(replies)
                    elif orphans:
                        orphans.pop(future, None)  # no answer: nothing was reserved that we know of
                return
            assert isinstance(replies, list)  # not failed
            for future, reply in zip(waiting, replies, strict=True):
                if not future.done():
                    future.set_result(reply)
                elif orphans:
                    answered = orphans.pop(future, None)
                    if answered is not None:
                        answered(reply)

        self._client.call(argc, body, answer)


def render(batcher: AdmitBatcher) -> str:
    """The admissions' round trips to Redis as Prometheus series (`/metrics`)."""
    return (
        "# HELP switchyard_tenant_admission_seconds Round trips of the limits script to Redis, from a "
        "batch's write to its answer (every request of the batch waits for one).\n"
        "# TYPE switchyard_tenant_admission_seconds summary\n"
        f"switchyard_tenant_admission_seconds_sum {batcher.seconds:.6f}\n"
        f"switchyard_tenant_admission_seconds_count {batcher.calls}\n"
        "# HELP switchyard_tenant_admission_requests_total Requests admitted or refused by those round "
        "trips (over their count: the batch size).\n"
        "# TYPE switchyard_tenant_admission_requests_total counter\n"
        f"switchyard_tenant_admission_requests_total {batcher.requests}\n"
    )


def encode_scopes(args: list[str]) -> tuple[int, bytes, bytes]:
    """A request's scope arguments for `AdmitBatcher.admit`: their number, it encoded, and them encoded
    (RESP). `limits.ADMIT` wants the number, the tokens, the cost, then the scopes."""
    return len(args), bulk(len(args)), b"".join(bulk(a) for a in args)
