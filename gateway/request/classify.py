"""Step 2: describe the request in the terms routing and accounting use (size, caller, priority, session).

Which class a request belongs to is the routing policy's decision (policies/engine.py); this step only
gathers the facts its rules read, cheaply, before anything is forwarded.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from gateway.request.allowance import ClassOf, apply_allowance
from gateway.request.parse import ParsedRequest
from gateway.request.prompt_size import PromptSizer
from policies.hints import HeaderHints
from policies.profile import RequestProfile, context_needed

if TYPE_CHECKING:
    from gateway.tenants.admission import Admission, Tenant


@dataclass(slots=True)
class Caller:
    """What the HTTP layer read about the client besides the body."""

    request_id: str
    """Made by the gateway (gateway/http/routes.py), unguessable: the ledger's key for this request."""
    authorization: str | None
    forwarded: dict[str, str]
    """Headers sent on to the backend (request id, trace context)."""
    priority: str | None = None
    """`x-switchyard-priority`."""
    explicit_class: str | None = None
    """`x-switchyard-class`: the class the client asks for (used when the policy defines it)."""
    tenant: str | None = None
    """`x-switchyard-tenant`."""
    session: str | None = None
    """`x-session-id`: requests of one session prefer one backend (its prefix cache is warm)."""
    headers: list[tuple[bytes, bytes]] | None = None
    """All request headers as received, for policy rules on arbitrary headers."""
    key: Tenant | None = None
    """The authenticated API key (`auth.mode: keys`), set at the edge."""
    admission: Admission | None = None
    """Its reservation in the key's and team's limits, settled once at the request's end."""
    client_request_id: str | None = None
    """The client's valid `x-request-id`: echoed and logged, never used for accounting."""
    hints_ignored: list[str] | None = None
    """With a key: the hints it may not give, left out of the profile (`x-switchyard-hints-ignored`)."""


@lru_cache(maxsize=4096)
def key_id(authorization: str | None) -> str:
    if not authorization:
        return "anonymous"
    scheme, _, credentials = authorization.strip().partition(" ")
    token = credentials.strip() if scheme.lower() == "bearer" else authorization.strip()
    return "key-" + hashlib.sha256(token.encode()).hexdigest()[:12] if token else "anonymous"


_DEFAULT_SIZER = PromptSizer()
"""Never taught: the default characters per token, for callers without a gateway's sizer (CLI, bench)."""


def classify(
    parsed: ParsedRequest,
    caller: Caller,
    sizer: PromptSizer = _DEFAULT_SIZER,
    hints: HeaderHints | None = None,
    class_of: ClassOf | None = None,
) -> RequestProfile:
    """The request's profile; with an API key (`caller.key`), holding only the hints the key may give
    (`hints`, `class_of`: the policy's, see gateway/request/allowance.py)."""
    key = key_id(caller.authorization)
    prompt_tokens = sizer.estimate(parsed.model, key, parsed.prompt_chars)
    profile = RequestProfile(
        model=parsed.model,
        prompt_tokens_estimate=prompt_tokens,
        context_needed=context_needed(prompt_tokens, parsed.max_tokens),
        max_tokens=parsed.max_tokens,
        n=parsed.n,
        stream=parsed.stream,
        key_id=key,
        priority=caller.priority or parsed.priority,
        tenant=caller.tenant,
        session=caller.session or parsed.user,
        explicit_class=caller.explicit_class,
        parsed=parsed,
        headers=caller.headers,
    )
    if caller.key is not None:
        caller.hints_ignored = apply_allowance(profile, caller.key.key, hints, class_of)
    return profile
