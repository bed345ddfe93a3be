"""What an admission answers: the verdict of `limits.ADMIT`, the OpenAI SDK's `x-ratelimit-*` headers, and
the 429 a refusal raises."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.openai.errors import GatewayError
from gateway.tenants import errors
from gateway.tenants.keys import Limits
from gateway.tenants.limits import ScopeCounters, Verdict


def verdict_of(reply: bytes | str) -> Verdict:
    """`limits.ADMIT`'s answer, `admitted|scope|limit|reset ms|window|counts...`."""
    parts = (reply if isinstance(reply, bytes) else reply.encode()).split(b"|")
    return Verdict(
        parts[0] == b"1",
        int(parts[1]),
        parts[2].decode() if parts[2] else "",
        int(parts[3]) / 1000.0,
        int(parts[4]),
        list(map(int, parts[5:])),
    )


@dataclass(frozen=True, slots=True)
class HeaderPlan:
    """Which counts of an admitted verdict the `x-ratelimit-*` headers read, worked out once per key
    (`Tenants._prepare`) rather than per request: (index in `Verdict.counts`, limit, the limit as text)."""

    requests: tuple[tuple[int, int, bytes], ...]
    tokens: tuple[tuple[int, int, bytes], ...]

    @classmethod
    def of(cls, scopes: list[ScopeCounters]) -> HeaderPlan:
        requests = tuple(
            (3 * i, s.limits.rpm, b"%d" % s.limits.rpm) for i, s in enumerate(scopes) if s.limits.rpm
        )
        tokens = tuple(
            (3 * i + 1, s.limits.tpm, b"%d" % s.limits.tpm) for i, s in enumerate(scopes) if s.limits.tpm
        )
        return cls(requests, tokens)

    def lines(self, verdict: Verdict) -> bytes:
        """`rate_headers` of an admitted verdict (every scope's counts present) as the head's lines,
        `name: value\\r\\n` each: numbers the gateway formats, sent as they are (`pairs` reads them back)."""
        out = b""
        counts = verdict.counts
        reset = b"%.3fs" % verdict.reset_s
        # the tightest of the key's and its team's limits, inline (no call): this runs for every admission
        for entries, template in ((self.requests, _REQUESTS), (self.tokens, _TOKENS)):
            best, best_text = -1, b""
            for index, limit, text in entries:
                left = limit - counts[index]
                if left < 0:
                    left = 0
                if best < 0 or left < best:
                    best, best_text = left, text
            if best >= 0:
                out += template % (best_text, best, reset)
        return out


_REQUESTS = (
    b"x-ratelimit-limit-requests: %b\r\n"
    b"x-ratelimit-remaining-requests: %d\r\n"
    b"x-ratelimit-reset-requests: %b\r\n"
)
_TOKENS = (
    b"x-ratelimit-limit-tokens: %b\r\nx-ratelimit-remaining-tokens: %d\r\nx-ratelimit-reset-tokens: %b\r\n"
)


def pairs(lines: bytes) -> list[tuple[bytes, bytes]]:
    """Header lines (`name: value\\r\\n` each) as ASGI headers."""
    out: list[tuple[bytes, bytes]] = []
    for line in lines.split(b"\r\n")[:-1]:
        name, _, value = line.partition(b": ")
        out.append((name, value))
    return out


def encoded(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]


def decoded(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in headers}


def rate_headers(scopes: list[ScopeCounters], verdict: Verdict) -> dict[str, str]:
    """The OpenAI SDK's `x-ratelimit-*` headers for the tightest of the key's and team's limits."""
    headers: dict[str, str] = {}
    reset = f"{verdict.reset_s:.3f}s"
    best_requests: tuple[int, int] | None = None
    best_tokens: tuple[int, int] | None = None
    counts = verdict.counts
    for i, s in enumerate(scopes):
        if 3 * i + 1 >= len(counts):
            break
        lim = s.limits
        if lim.rpm is not None:
            left = max(0, lim.rpm - counts[3 * i])
            if best_requests is None or left < best_requests[1]:
                best_requests = (lim.rpm, left)
        if lim.tpm is not None:
            left = max(0, lim.tpm - counts[3 * i + 1])
            if best_tokens is None or left < best_tokens[1]:
                best_tokens = (lim.tpm, left)
    if best_requests is not None:
        headers["x-ratelimit-limit-requests"] = str(best_requests[0])
        headers["x-ratelimit-remaining-requests"] = str(best_requests[1])
        headers["x-ratelimit-reset-requests"] = reset
    if best_tokens is not None:
        headers["x-ratelimit-limit-tokens"] = str(best_tokens[0])
        headers["x-ratelimit-remaining-tokens"] = str(best_tokens[1])
        headers["x-ratelimit-reset-tokens"] = reset
    return headers


def limit_headers(key: Limits, team: Limits | None) -> dict[str, str]:
    """The tightest limits of a key and its team, when nothing of theirs was admitted here yet."""
    headers: dict[str, str] = {}
    scopes = [key] + ([team] if team is not None else [])
    rpms = [s.rpm for s in scopes if s.rpm is not None]
    tpms = [s.tpm for s in scopes if s.tpm is not None]
    if rpms:
        headers["x-ratelimit-limit-requests"] = str(min(rpms))
    if tpms:
        headers["x-ratelimit-limit-tokens"] = str(min(tpms))
    return headers


def refusal(scope: ScopeCounters, verdict: Verdict, headers: dict[str, str], tokens: int) -> GatewayError:
    lim, who = scope.limits, ("team " + scope.name[2:]) if scope.name.startswith("t:") else "this key"
    why = verdict.refused_by
    if why == "budget":
        return errors.insufficient_quota(who, lim.budget_usd or 0.0, lim.budget_period, headers)
    if why == "parallel":
        message = f"Too many requests in flight for {who}: limit {lim.max_parallel}."
        return errors.rate_limited("requests", message, 1.0, headers)
    if why == "tokens":
        if lim.tpm is not None and tokens > lim.tpm:
            message = f"Request too large for {who}: {tokens} tokens (prompt + max_tokens), limit {lim.tpm}."
            return errors.rate_limited(
                "tokens", message, verdict.reset_s, {**headers, "x-should-retry": "false"}
            )
        message = f"Rate limit reached for {who} on tokens per window: limit {lim.tpm}, requested {tokens}."
        return errors.rate_limited("tokens", message, verdict.reset_s, headers)
    message = f"Rate limit reached for {who} on requests per window: limit {lim.rpm}."
    return errors.rate_limited("requests", message, verdict.reset_s, headers)
