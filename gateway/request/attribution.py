"""Whose fault a failed attempt is: the backend's (its breaker counts it) or the request's (it does not).

A backend is sick when it fails requests that other backends serve; a request is bad when it fails
everywhere. So a 5xx answer or a first-byte timeout is only a *suspect* failure until a second opinion:
the request goes to the next candidate, and

- if that one answers (2xx or 4xx), the first backend failed a request another could serve: its breaker
  counts the failure;
- if that one fails the same way (5xx again, or times out again), the request is the common cause:
  failover stops, the client gets the backend's error, and neither breaker counts it;
- if there is no second candidate (or no retry left), the failure is unverified: the breaker counts it,
  but the one that would open it first asks the backend's health check (backends/breaker.py `suspect`).

A timeout whose request asks for more work than the backend does within the timeout (prompt and
n x max_tokens at the backend's measured speed, `predicted_seconds`) is the request's from the start: no
failover (every backend would time out the same way after holding the work as long), no breaker count,
and a 504 that says why. Refused and broken connections are always the backend's.
"""

from __future__ import annotations

from backends.models import Backend
from gateway.openai.errors import GatewayError, normalise_upstream_error, upstream_failed, upstream_timeout
from gateway.request.parse import ParsedRequest

FIVE_XX = "an error answer (5xx)"
TIMEOUT = "no answer in time"

PREFILL_SPEEDUP = 10.0
"""A prompt token costs about this many times less than a generated one (prefill runs a prompt's tokens
in parallel): a deliberately rough weight, since only large multiples of the timeout matter here."""

SIZE_EXPLAINS = 0.5
"""A timeout is explained by the request's size when its predicted work takes at least this share of the
time it was given."""


def predicted_seconds(parsed: ParsedRequest, prompt: int, backend: Backend) -> float:
    """Seconds the backend needs before its first byte: the whole answer, or a stream's first chunk, for
    a prompt of about `prompt` tokens (the gateway's estimate, gateway/request/prompt_size.py)."""
    observed, pool = backend.observed, backend.pool
    ttft = observed.ttft if observed.ttft is not None else pool.prior_ttft_s
    tpot = observed.tpot if observed.tpot is not None else pool.prior_tpot_s
    n = max(1, parsed.n)
    if parsed.endpoint == "embeddings":
        generated = 0.0
    elif parsed.stream or parsed.max_tokens is None:
        # One token per choice: before a stream's first chunk; and when the length is unbounded, since
        # most answers stop long before the context ends (only `n` and the prompt can explain it then).
        generated = float(n)
    else:
        generated = float(n) * parsed.max_tokens
    return ttft + (prompt / PREFILL_SPEEDUP + generated) * tpot


def size_explains_timeout(
    parsed: ParsedRequest, prompt: int, backend: Backend, waited: float
) -> float | None:
    """The predicted seconds when they explain a timeout after `waited` seconds, else None."""
    predicted = predicted_seconds(parsed, prompt, backend)
    return predicted if predicted >= waited * SIZE_EXPLAINS else None


def too_large_for_timeout(
    parsed: ParsedRequest, prompt_tokens: int, backend: Backend, waited: float, predicted: float
) -> GatewayError:
    asked = "" if parsed.max_tokens is None else f"max_tokens={parsed.max_tokens}, "
    return GatewayError(
        504,
        f"The request did not get an answer from backend `{backend.name}` within {waited:g} s, and its "
        f"size explains it ({asked}n={parsed.n}, a prompt of about {prompt_tokens} tokens: "
        f"about {predicted:.3g} s of work at that backend's measured speed). It was not retried on "
        "other backends, which would time out the same way; ask for fewer tokens (max_tokens, n) or "
        "stream the answer.",
        "timeout",
        code="request_too_large_for_timeout",
    )


def the_requests_fault(
    kind: str,
    backends: list[str],
    status: int,
    payload: bytes,
    backend: Backend,
    waited: float,
) -> GatewayError:
    """The error for a request that failed the same way on two backends (a 502 with the last backend's
    message, or a 504), saying that the gateway took the request as the cause."""
    if kind == TIMEOUT:
        error = upstream_timeout(backend.name, waited, "an answer")
    else:
        reason = normalise_upstream_error(status, payload, backend.name).body.message
        error = upstream_failed(backend.name, f"HTTP {status}: {reason}")
    error.body.message = (
        f"{error.body.message.rstrip('.')}. Backends {' and '.join(backends)} both failed this request "
        f"the same way ({kind}), so the gateway takes the request as the cause: it was not retried "
        "further and counts against no backend."
    )
    error.headers.update(
        {
            "x-switchyard-backend": backend.name,
            "x-switchyard-pool": backend.pool.name,
            "x-switchyard-vendor": backend.pool.vendor,
            "x-switchyard-attempts": str(len(backends)),
            "x-switchyard-backends-tried": ",".join(backends),
        }
    )
    return error
