"""`/console`: the operator console's routes. Pages need a session (gateway/console/session.py); every
action (POST) needs the session, its CSRF token and a same-origin Origin/Referer.

Reads and actions go through the admin API's handler functions (gateway/console/data.py), so they are
the admin API's, on the same shared state.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from litestar import Controller, Request, Response, Router, get, post
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect

from backends.catalog import Catalog
from gateway.admin.login_throttle import LoginThrottle, client_address, retry_after
from gateway.console import data, pages
from gateway.console.keys_page import keys_fragment, keys_page
from gateway.console.routing_page import explained_fragment, routing_page
from gateway.console.session import (
    COOKIE,
    CSRF_HEADER,
    Revocations,
    Sessions,
    cleared_cookie_header,
    same_origin,
)
from gateway.http.controllers import per_app
from gateway.ledger.records import Ledger
from gateway.openai.errors import GatewayError
from gateway.redis.client import REDIS_ERRORS
from gateway.request.parse import UPSTREAM_PATHS
from gateway.tenants.admission import Tenants

log = logging.getLogger("switchyard.console")
STATIC = Path(__file__).parent / "static"
_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
NO_ADMIN_KEY = (
    "The console needs an admin key, and none is configured: set the environment variable named by "
    "`auth.admin_key_env` (SWITCHYARD_ADMIN_KEY by default) and restart the gateway."
)
Req = Request[Any, Any, Any]


def _refused(status: int, message: str, code: str) -> GatewayError:
    kind = "authentication_error" if status == 401 else "permission_error"
    return GatewayError(status, message, kind, code=code, headers=SECURITY_HEADERS)


def _html(body: str, status: int = 200, headers: dict[str, str] | None = None) -> Response[str]:
    return Response(
        body, status_code=status, media_type="text/html", headers={**SECURITY_HEADERS, **(headers or {})}
    )


class Console:
    def __init__(self, catalog: Catalog, ledger: Ledger, tenants: Tenants | None, admin: Router) -> None:
        self.catalog = catalog
        self.tenants = tenants
        admin_hash = tenants.admin_hash if tenants is not None else None
        self.sessions = None
        if tenants is not None and admin_hash:
            ended = Revocations(tenants.client, "{syt:" + tenants.prefix + "}", tenants.options.redis_timeout)
            self.sessions = Sessions(admin_hash, revocations=ended)
        self.api = data.AdminApi(h for by_method in admin.route_handler_method_map.values()
                                 for h in by_method.values())  # fmt: skip
        self.series = data.CostSeries(ledger)
        self.recent = data.Recent(ttl=10.0)

    async def session(self, request: Req) -> str | None:
        token = request.cookies.get(COOKIE)
        return token if self.sessions is not None and await self.sessions.live(token) else None

    async def page_or_login(self, request: Req) -> tuple[str | None, Response[str] | None]:
        """(session, None), or (None, the login page refusing the request)."""
        if self.sessions is None:
            return None, _html(pages.login(NO_ADMIN_KEY, enabled=False), 503)
        token = await self.session(request)
        if token is None:
            return None, _html(pages.login("Log in with the admin key."), 401)
        return token, None

    async def check_action(self, request: Req, form_csrf: str | None = None) -> str:
        """The session of an allowed action; raises the refusal otherwise."""
        if self.sessions is None:
            raise _refused(503, NO_ADMIN_KEY, "console_disabled")
        if not same_origin(request):
            raise _refused(
                403, "Refused: the action was not sent from this console's origin.", "cross_origin"
            )
        token = await self.session(request)
        if token is None:
            raise _refused(401, "Log in to the console first.", "no_session")
        if not self.sessions.csrf_ok(token, form_csrf or request.headers.get(CSRF_HEADER)):
            raise _refused(403, "Refused: missing or wrong CSRF token; reload the page.", "csrf")
        return token

    async def render(self, request: Req, token: str, slug: str, title: str, body: str) -> Response[str]:
        """The page in its frame; every page but Fleet (whose fragment has it) opens with the fleet's
        trouble, if any."""
        assert self.sessions is not None
        alert = "" if slug == "fleet" else pages.fleet_alert(await data.fleet(self.api, request))
        return _html(pages.frame(title, slug, self.sessions.csrf_token(token), alert + body))

    def backend_extra(self) -> dict[str, dict[str, Any]]:
        return {
            b.name: {"accelerator": b.pool.accelerator, "ttft": b.observed.ttft, "tpot": b.observed.tpot}
            for b in self.catalog.backends
        }

    async def fleet_fragment(self, request: Req) -> str:
        """The fleet with the last hour's cost per backend and pool, as last read (never waited for)."""
        kept = self.recent.peek(("fleet-costs",), lambda: self.fleet_costs(request))
        costs = kept[1] if kept is not None else None
        return pages.fleet_fragment(await data.fleet(self.api, request), self.backend_extra(), costs)

    async def fleet_costs(self, request: Req) -> dict[str, dict[str, dict[str, Any]]]:
        return {
            by: {row["name"]: row for row in await data.costs(self.api, request, by, "1h")}
            for by in ("backend", "pool")
        }

    async def costs_body(self, request: Req, window: str) -> str:
        tables = {by: await data.costs(self.api, request, by, window)
                  for by in ("vendor", "pool", "backend", "key", "model")}  # fmt: skip
        if self.series.available:
            step, count = data.CHART_STEPS[window]
            starts, series = await self.series.series("vendor", step, count)
            chart = pages.cost_chart(starts, step, series)
        else:
            chart = "<p>This ledger keeps no history (ledger.store: none).</p>"
        keys = await data.keys_with_spend(self.api)
        names = {k["id"]: k.get("name") for k in keys}
        for row in tables["key"]:
            row["name"] = f"{names.get(row['name']) or ''} {row['name']}".strip() or "(no key)"
        return pages.costs_page(window, tables, chart)

    async def keys_fragment(self) -> str:
        return keys_fragment(await data.keys_with_spend(self.api), self.api.has("keys-list"))


class ConsoleController(Controller):
    """The console's pages and actions, over the app's `console` (its sessions and the admin API)."""

    path = "/console"
    console: Console
    throttle: LoginThrottle
    """Failed admin-key logins, shared with the admin API's guard: a wrong key slows its address down."""
    assets: dict[str, bytes]

    @get("/", name="console", include_in_schema=False)
    async def home(self) -> Redirect:
        return Redirect("/console/fleet", status_code=303)

    @get("/login", name="console-login-form")
    async def login_form(self, request: Req) -> Response[Any]:
        if await self.console.session(request) is not None:
            return Redirect("/console/fleet", status_code=303)
        if self.console.sessions is None:
            return _html(pages.login(NO_ADMIN_KEY, enabled=False), 503)
        return _html(pages.login())

    @post("/login", name="console-login", status_code=303)
    async def login(self, request: Req) -> Response[Any]:
        sessions = self.console.sessions
        if sessions is None:
            return _html(pages.login(NO_ADMIN_KEY, enabled=False), 503)
        if not same_origin(request):
            return _html(pages.login("Refused: the login was not sent from this console's origin."), 403)
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        material = (form.get("admin_key") or [""])[0].strip()
        if not material:
            return _html(pages.login("That is not the admin key."), 401)
        address = client_address(request.client.host if request.client else None)
        gate = await self.throttle.check(address)
        if gate.wait_s > 0:  # refused unchecked: checking would tell a guesser which guess was right
            self.throttle.refused("console")
            wait = retry_after(gate.wait_s)
            message = f"Too many failed logins from your address: try again in {wait} s."
            return _html(pages.login(message), 429, {"retry-after": wait})
        if not sessions.is_admin_key(material):
            await self.throttle.failed(address, "console")
            return _html(pages.login("That is not the admin key."), 401)
        await self.throttle.succeeded(address, gate)
        # Start reading the costs now: the slow read is done while the operator looks at the fleet.
        self.console.recent.start(("costs", "1h"), lambda: self.console.costs_body(request, "1h"))
        self.console.recent.start(("fleet-costs",), lambda: self.console.fleet_costs(request))
        headers = {"location": "/console/fleet", "set-cookie": sessions.cookie_header(sessions.issue())}
        return Response("", status_code=303, headers={**SECURITY_HEADERS, **headers})

    @post("/logout", name="console-logout", status_code=303)
    async def logout(self, request: Req) -> Response[Any]:
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        csrf = form.get("csrf")
        token = await self.console.check_action(request, csrf[0] if csrf else None)
        assert self.console.sessions is not None
        cleared = {"set-cookie": cleared_cookie_header()}
        try:
            await self.console.sessions.end(token)
        except (TimeoutError, *REDIS_ERRORS) as exc:  # this replica refuses it already; the others may not
            log.warning("console: logout not shared with the other replicas (%s)", exc)
            message = "Logged out here, but the other replicas could not be told (Redis unreachable)."
            headers = {**SECURITY_HEADERS, **cleared}
            raise GatewayError(
                503, message, "server_error", code="logout_not_shared", headers=headers
            ) from None
        headers = {"location": "/console/login", **cleared}
        return Response("", status_code=303, headers={**SECURITY_HEADERS, **headers})

    @get("/fleet", name="console-fleet")
    async def fleet_page(self, request: Req) -> Response[str]:
        token, refusal = await self.console.page_or_login(request)
        if token is None:
            assert refusal is not None  # no session: the login page refuses
            return refusal
        body = pages.fleet_page(await self.console.fleet_fragment(request))
        return await self.console.render(request, token, "fleet", "Fleet", body)

    @get("/fleet/fragment", name="console-fleet-fragment")
    async def fleet_fragment(self, request: Req) -> Response[str]:
        token, refusal = await self.console.page_or_login(request)
        if token is None:
            assert refusal is not None  # no session: the login page refuses
            return refusal
        return _html(await self.console.fleet_fragment(request))

    @get("/costs", name="console-costs")
    async def costs_page(self, request: Req, window: FromQuery[str] = "1h") -> Response[str]:
        token, refusal = await self.console.page_or_login(request)
        if token is None:
            assert refusal is not None  # no session: the login page refuses
            return refusal
        if window not in data.WINDOWS:
            window = "1h"
        read_at, body = await self.console.recent.get(
            ("costs", window), lambda: self.console.costs_body(request, window)
        )
        as_of = f'<p class="summary">As of {time.strftime("%H:%M:%S", time.localtime(read_at))}</p>'
        budgets = pages.budgets_section(await data.keys_with_spend(self.console.api))
        return await self.console.render(request, token, "costs", "Costs", as_of + body + budgets)

    @get("/routing", name="console-routing")
    async def routing(self, request: Req) -> Response[str]:
        token, refusal = await self.console.page_or_login(request)
        if token is None:
            assert refusal is not None  # no session: the login page refuses
            return refusal
        state = await self.console.api.call("policy", request=request)
        mix = data.traffic_mix(await data.recent(self.console.api, request), time.time())
        body = routing_page(state, mix, list(UPSTREAM_PATHS))
        return await self.console.render(request, token, "routing", "Routing", body)

    @get("/keys", name="console-keys")
    async def keys(self, request: Req) -> Response[str]:
        token, refusal = await self.console.page_or_login(request)
        if token is None:
            assert refusal is not None  # no session: the login page refuses
            return refusal
        enabled = self.console.api.has("keys-list")
        body = keys_page(await self.console.keys_fragment(), enabled)
        return await self.console.render(request, token, "keys", "Keys", body)

    @get("/keys/fragment", name="console-keys-fragment")
    async def keys_fragment_view(self, request: Req) -> Response[str]:
        token, refusal = await self.console.page_or_login(request)
        if token is None:
            assert refusal is not None  # no session: the login page refuses
            return refusal
        return _html(await self.console.keys_fragment())

    @post("/backends/{name:str}/{action:str}", name="console-drain", status_code=200)
    async def drain(self, request: Req, name: FromPath[str], action: FromPath[str]) -> Response[Any]:
        await self.console.check_action(request)
        if action not in ("drain", "undrain"):
            raise GatewayError(404, f"Unknown path `{request.url.path}`.", "invalid_request_error")
        result = await self.console.api.call(action, name=name, state=request.app.state)
        return Response(result, headers=SECURITY_HEADERS)

    @post("/keys", name="console-keys-create", status_code=201)
    async def create_key(self, request: Req) -> Response[Any]:
        await self.console.check_action(request)
        if not self.console.api.has("keys-create"):
            raise _refused(404, "Keys need the tenants service.", "not_found")
        return Response(await self.console.api.call("keys-create", request=request), status_code=201,
                        headers=SECURITY_HEADERS)  # fmt: skip

    @post("/keys/{key_id:str}/revoke", name="console-keys-revoke", status_code=200)
    async def revoke_key(self, request: Req, key_id: FromPath[str]) -> Response[Any]:
        await self.console.check_action(request)
        if not self.console.api.has("keys-revoke"):
            raise _refused(404, "Keys need the tenants service.", "not_found")
        return Response(await self.console.api.call("keys-revoke", key_id=key_id), headers=SECURITY_HEADERS)

    @post("/explain", name="console-explain", status_code=200)
    async def explain(self, request: Req, endpoint: FromQuery[str] = "chat") -> Response[str]:
        await self.console.check_action(request)
        result = await self.console.api.call("explain", request=request, endpoint=endpoint)
        return _html(explained_fragment(result))

    @get("/static/{file:str}", name="console-static")
    async def static(self, file: FromPath[str]) -> Response[bytes]:
        content = self.assets.get(file)
        if content is None:
            raise GatewayError(404, f"No console asset `{file}`.", "invalid_request_error")
        headers = {"cache-control": "max-age=300", "x-content-type-options": "nosniff"}
        return Response(content, media_type=_TYPES[Path(file).suffix], headers=headers)


def console_controller(
    catalog: Catalog,
    ledger: Ledger,
    tenants: Tenants | None,
    admin: Router,
    throttle: LoginThrottle | None = None,
) -> type[ConsoleController]:
    """The console over the app's `admin` router (it calls its handlers: what the JSON API answers). With
    `throttle`, the admin API's, one count of failed logins for both."""
    return per_app(
        ConsoleController,
        console=Console(catalog, ledger, tenants, admin),
        throttle=throttle if throttle is not None else LoginThrottle(),
        assets={p.name: p.read_bytes() for p in STATIC.iterdir() if p.suffix in _TYPES},
    )
