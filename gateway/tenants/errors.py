"""The errors tenants get, in OpenAI's shape and with OpenAI's codes (the SDK reacts to them)."""

from __future__ import annotations

from gateway.openai.errors import GatewayError


def invalid_api_key(why: str) -> GatewayError:
    return GatewayError(401, why, "invalid_request_error", code="invalid_api_key")


KEY_UNUSABLE = frozenset({"key_revoked", "key_expired", "key_not_found"})


def key_unusable(code: str, why: str) -> GatewayError:
    """Work a key started (a batch) that it can no longer run: `code` is one of `KEY_UNUSABLE`."""
    return GatewayError(401, why, "invalid_request_error", code=code)


def model_not_allowed(model: str) -> GatewayError:
    return GatewayError(
        403,
        f"This API key may not use the model `{model}`.",
        "permission_error",
        code="model_not_allowed",
        param="model",
    )


def forbidden(why: str) -> GatewayError:
    return GatewayError(403, why, "permission_error", code="forbidden")


def rate_limited(what: str, message: str, retry_after_s: float, headers: dict[str, str]) -> GatewayError:
    wait = max(0.001, retry_after_s)
    headers = {
        **headers,
        "retry-after": str(max(1, int(-(-wait // 1)))),
        "retry-after-ms": str(int(wait * 1000)),
    }
    return GatewayError(429, message, what, code="rate_limit_exceeded", headers=headers)


def insufficient_quota(scope: str, budget_usd: float, period: str, headers: dict[str, str]) -> GatewayError:
    return GatewayError(
        429,
        f"You exceeded the {period} budget of ${budget_usd:g} for {scope}. Ask an operator to raise it.",
        "insufficient_quota",
        code="insufficient_quota",
        # Waiting does not help within the period: tell the OpenAI SDK not to retry.
        headers={**headers, "x-should-retry": "false"},
    )


def limits_unavailable(why: str) -> GatewayError:
    return GatewayError(
        503,
        f"Rate limits and budgets cannot be checked right now ({why}). Retry shortly.",
        "server_error",
        code="limits_unavailable",
        headers={"retry-after": "1"},
    )
