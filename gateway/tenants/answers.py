"""What an admission answers: the verdict of `limits.ADMIT`, the OpenAI SDK's `x-ratelimit-*` headers, and
the 429 a refusal raises."""

from __future__ import annotations

from gateway.errors import GatewayError
from gateway.tenants import errors
from gateway.tenants.keys import Limits
from gateway.tenants.limits import ScopeCounters, Verdict


def verdict_of(reply: bytes | str) -> Verdict:
    """`limits.ADMIT`'s answer, `admitted|scope|limit|reset ms|window|counts...`."""
    text = reply.decode() if isinstance(reply, bytes) else reply
    admitted, scope, limit, reset_ms, window, *counts = text.split("|")
    return Verdict(
        admitted == "1", int(scope), limit, int(reset_ms) / 1000.0, int(window), [int(c) for c in counts]
    )


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
