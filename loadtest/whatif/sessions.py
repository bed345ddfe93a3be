"""A session's requests in order: its client reads each answer before it sends the next request.

The access log writes a hash of each request's session (`x-session-id`, or the body's `user`). A replay that
sends every request at its logged time is an open loop, but a session's next turn was sent only after its
previous answer ended, and a think time later. Where the replayed fleet is slower than the logged one, an
open loop piles a session's turns on top of each other (more requests in flight than the real run ever
had, which slows it further); where it is faster, it leaves gaps the real clients would have filled.
`Sessions` keeps each session's order: its next request is sent the logged think time after the replayed
answer ends. Requests without a session, and a session's requests that overlapped in the log (sent before
the previous one ended), keep their logged times.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from loadtest.whatif.accesslog import Recorded


class Sessions:
    def __init__(self, requests: Sequence[Recorded], keep_order: bool = True) -> None:
        """`requests` in arrival order; `keep_order` False: every request at its logged time."""
        self._next: dict[int, tuple[Recorded, float]] = {}
        """Per request index, its session's next request and the think time between them."""
        self.follows: set[int] = set()
        """The indices of requests sent when their session's previous one ends, not at their logged time."""
        self._due: list[tuple[float, int, Recorded]] = []
        last: dict[str, Recorded] = {}
        for request in requests if keep_order else ():
            key = request.line.session_hash
            if not key:
                continue
            previous, last[key] = last.get(key), request
            if previous is not None and request.at_s >= previous.end_s:
                self._next[previous.index] = (request, request.at_s - previous.end_s)
                self.follows.add(request.index)

    def ended(self, index: int, at: float) -> None:
        """Request `index` ended at `at` (answered, refused or failed): its session's next one is due."""
        following = self._next.pop(index, None)
        if following is not None:
            request, think_s = following
            heapq.heappush(self._due, (at + think_s, request.index, request))

    def next_at(self) -> float:
        """When the earliest request released by its session is due (inf: none)."""
        return self._due[0][0] if self._due else math.inf

    def pop(self) -> Recorded:
        return heapq.heappop(self._due)[2]
