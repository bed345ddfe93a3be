"""`/admin/v1/keys` and `/admin/v1/teams`, and the guard in front of every `/admin/...` route (the admin
router's, gateway/admin/router.py).

Admin routes need an admin key: the bootstrap key from the environment (`auth.admin_key_env`) or a key
with the `admin` scope. A tenant key may read only its own usage and costs (`by=key`, its own key) and
its own record (`/admin/v1/keys/self`); anything else answers 403, no key or a bad one 401.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from litestar import Controller, Request, delete, get, patch, post, put
from litestar.connection import ASGIConnection
from litestar.enums import ScopeType
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath, FromQuery
from litestar.types import Guard

from gateway.admin.login_throttle import LoginThrottle, client_address, too_many_failed_logins
from gateway.http.controllers import per_app
from gateway.http.credentials import authorization
from gateway.http.query_params import refuse_repeated
from gateway.openai.errors import GatewayError, invalid_request
from gateway.tenants import errors
from gateway.tenants.admission import Tenant, Tenants
from gateway.tenants.keys import (
    KeyFields,
    KeyRecord,
    TeamRecord,
    apply_fields,
    hash_key,
    new_key,
    new_key_material,
)
from gateway.tenants.limits import budget_period

ADMIN_PREFIX = "/admin/"
TENANT_READABLE = {"/admin/v1/usage", "/admin/v1/costs"}
_STATE_TENANT = "switchyard_tenant"
_STATE_VISIBLE = "switchyard_visible_keys"


def admin_guard(tenants: Tenants, throttle: LoginThrottle | None = None) -> Guard:
    """With `throttle`, a wrong key slows its address down (gateway/admin/login_throttle.py)."""

    async def authenticate(connection: ASGIConnection[Any, Any, Any, Any]) -> Tenant:
        credential = authorization(connection.scope["headers"])
        if throttle is None or not credential:  # no key given: nothing guessed
            return await tenants.authenticate(credential)
        address = client_address(connection.client.host if connection.client else None)
        gate = await throttle.check(address)
        if gate.wait_s > 0:
            throttle.refused("admin_api")
            raise too_many_failed_logins(gate.wait_s)
        try:
            tenant = await tenants.authenticate(credential)
        except GatewayError as exc:
            if exc.status == 401:
                await throttle.failed(address, "admin_api")
            raise
        if tenant.admin:
            await throttle.succeeded(address, gate)
        return tenant

    async def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        path = connection.scope["path"]
        if not path.startswith(ADMIN_PREFIX):
            return
        refuse_repeated(connection.scope.get("query_string", b""))
        tenant = await authenticate(connection)
        connection.scope.setdefault("state", {})[_STATE_TENANT] = tenant
        query = connection.query_params
        team, key = query.get("team"), query.get("key")
        if tenant.admin:
            if team is not None or key is not None:
                members = {k.id for k in await tenants.store.list_keys() if team is None or k.team == team}
                connection.scope["state"][_STATE_VISIBLE] = members & {key} if key is not None else members
            return
        own = tenant.key
        scope = connection.scope
        method = scope["method"] if scope["type"] == ScopeType.HTTP else None  # no websockets here
        if path == "/admin/v1/keys/self" and method == "GET":
            return
        if path not in TENANT_READABLE or method != "GET":
            raise errors.forbidden("This endpoint needs an admin key.")
        if team is not None and team != own.team:
            raise errors.forbidden(f"A tenant key reads only its own usage, not team `{team}`'s.")
        if key is not None and key != own.id:
            raise errors.forbidden("A tenant key reads only its own usage.")
        if query.get("by", "backend") != "key":
            raise errors.forbidden("A tenant key reads usage and costs by key only (`by=key`).")
        connection.scope["state"][_STATE_VISIBLE] = {own.id}

    return guard


def visible_rows(request: Request[Any, Any, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows (`name` = a key id) the caller may see: a tenant its own key, `?team=`/`?key=` their keys."""
    visible = request.scope.get("state", {}).get(_STATE_VISIBLE)
    return rows if visible is None else [row for row in rows if row.get("name") in visible]


def _fields(body: bytes) -> tuple[KeyFields, set[str]]:
    try:
        raw = msgspec.json.decode(body or b"{}")
        if not isinstance(raw, dict):
            raise invalid_request("The body must be a JSON object.")
        return msgspec.convert(raw, KeyFields), set(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise invalid_request(f"Invalid key fields: {exc}.") from None


def _not_found(what: str) -> GatewayError:
    return GatewayError(404, f"No {what}.", "invalid_request_error", code="not_found")


class KeysController(Controller):
    """`/admin/v1/keys` and `/admin/v1/teams` over the app's `tenants` (built by `keys_controller`)."""

    path = "/admin/v1"
    tenants: Tenants

    async def find(self, key_id: str) -> KeyRecord:
        record = await self.tenants.store.get_key(key_id)
        if record is None:
            raise _not_found(f"key `{key_id}`")
        return record

    async def shown(self, record: KeyRecord) -> dict[str, Any]:
        period, _ = budget_period(record.budget_period, time.time())
        return {**record.public(), **await self.tenants.usage("k:" + record.id, period)}

    @post("/keys", name="keys-create", status_code=201)
    async def create(self, request: Request[Any, Any, Any]) -> dict[str, Any]:
        fields, given = _fields(await request.body())
        material, record = new_key(fields, given)
        self.tenants.changed(await self.tenants.store.put_key(record))
        return {"key": material, **record.public()}

    @get("/keys", name="keys-list")
    async def list_keys(self, team: FromQuery[str | None] = None) -> dict[str, Any]:
        keys = [k.public() for k in await self.tenants.store.list_keys() if team is None or k.team == team]
        return {"data": keys}

    @get("/keys/self", name="keys-self")
    async def own(self, request: Request[Any, Any, Any]) -> dict[str, Any]:
        tenant: Tenant = request.scope["state"][_STATE_TENANT]
        return await self.shown(tenant.key)

    @get("/keys/{key_id:str}", name="keys-get")
    async def read(self, key_id: FromPath[str]) -> dict[str, Any]:
        return await self.shown(await self.find(key_id))

    @patch("/keys/{key_id:str}", name="keys-update")
    async def update(self, key_id: FromPath[str], request: Request[Any, Any, Any]) -> dict[str, Any]:
        fields, given = _fields(await request.body())
        record = apply_fields(await self.find(key_id), fields, given)
        self.tenants.changed(await self.tenants.store.put_key(record))
        return record.public()

    @post("/keys/{key_id:str}/rotate", name="keys-rotate", status_code=200)
    async def rotate(self, key_id: FromPath[str]) -> dict[str, Any]:
        """New material for the same key (limits, spend and usage carry on); the old one stops at once."""
        record = await self.find(key_id)
        material = new_key_material()
        rotated = msgspec.structs.replace(record, hash=hash_key(material))
        self.tenants.changed(await self.tenants.store.put_key(rotated, old_hash=record.hash))
        return {"key": material, **rotated.public()}

    @post("/keys/{key_id:str}/revoke", name="keys-revoke", status_code=200)
    async def revoke(self, key_id: FromPath[str]) -> dict[str, Any]:
        record = msgspec.structs.replace(await self.find(key_id), revoked=True)
        self.tenants.changed(await self.tenants.store.put_key(record))
        return record.public()

    @get("/teams", name="teams-list")
    async def list_teams(self) -> dict[str, Any]:
        return {"data": [msgspec.to_builtins(t) for t in await self.tenants.store.list_teams()]}

    @get("/teams/{name:str}", name="teams-get")
    async def read_team(self, name: FromPath[str]) -> dict[str, Any]:
        team = await self.tenants.store.get_team(name)
        if team is None:
            raise _not_found(f"team `{name}`")
        period, _ = budget_period(team.budget_period, time.time())
        return {**msgspec.to_builtins(team), "spent_usd": await self.tenants.spent_usd("t:" + name, period)}

    @put("/teams/{name:str}", name="teams-put", status_code=200)
    async def put_team(self, name: FromPath[str], request: Request[Any, Any, Any]) -> dict[str, Any]:
        try:
            raw = msgspec.json.decode(await request.body() or b"{}")
            team = msgspec.convert({**raw, "name": name}, TeamRecord)
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError) as exc:
            raise invalid_request(f"Invalid team: {exc}.") from None
        self.tenants.changed(await self.tenants.store.put_team(team))
        return msgspec.to_builtins(team)

    @delete("/teams/{name:str}", name="teams-delete", status_code=200)
    async def delete_team(self, name: FromPath[str]) -> dict[str, Any]:
        found, version = await self.tenants.store.delete_team(name)
        self.tenants.changed(version)
        if not found:
            raise _not_found(f"team `{name}`")
        return {"deleted": name}


def keys_controller(tenants: Tenants) -> type[KeysController]:
    return per_app(KeysController, tenants=tenants)
