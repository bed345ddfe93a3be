"""Route groups as controllers built per app (gateway/http/controllers.py): the collaborators a controller
declares are exactly those it is given, a function given stays a plain function, and the console's pages
and actions reach the admin API's handlers of their own app."""

from __future__ import annotations

import re
from typing import Any

import pytest
from litestar import Controller, get
from litestar.testing import AsyncTestClient

from gateway.admin.ops import MetricsController
from gateway.app import create_app
from gateway.config.settings import settings_from_text
from gateway.console.session import COOKIE
from gateway.http.controllers import collaborators, per_app

ADMIN = "sy-controllers-admin-" + "Vq8Rf2Lk9Wx4Tb7Nz1Hm5Pc3Ds6Gy0Ja"
BASE = "https://testserver.local"
CONFIG = """
gateway: {health: {interval: 60}}
telemetry: {access_log: {enabled: false}}
pools:
  - name: h100
    vendor: nvidia
    accelerator: h100
    price_per_gpu_hour: 2.9
    backends:
      - {name: h100-a, url: "http://127.0.0.1:9", models: [m], max_model_len: 4096}
      - {name: h100-b, url: "http://127.0.0.1:9", models: [m], max_model_len: 4096}
"""


class _Greeting(Controller):
    path = "/hello"
    name: str
    shout: Any

    @get("/", name="hello")
    async def hello(self) -> dict[str, str]:
        return {"hello": self.shout(self.name)}


def test_a_controller_declares_its_collaborators_and_gets_exactly_those() -> None:
    assert collaborators(_Greeting) == {"name", "shout"}
    assert collaborators(MetricsController) == {"metrics", "flush", "gateway", "extra"}
    with pytest.raises(TypeError, match=r"missing \['shout'\], unknown \[\]"):
        per_app(_Greeting, name="x")
    with pytest.raises(TypeError, match=r"missing \[\], unknown \['nmae'\]"):
        per_app(_Greeting, name="x", shout=str.upper, nmae="y")
    bound = per_app(_Greeting, name="ada", shout=lambda s: s.upper() + "!", guards=[])
    assert issubclass(bound, _Greeting) and bound.__name__ == "_Greeting" and bound.guards == []
    assert _Greeting.__dict__.get("name") is None, "the declaring class is left as it was"


async def test_a_function_given_is_called_as_given_not_as_a_method() -> None:
    from litestar import Litestar

    app = Litestar([per_app(_Greeting, name="ada", shout=lambda s: s.upper() + "!")], openapi_config=None)
    async with AsyncTestClient(app) as client:
        assert (await client.get("/hello")).json() == {"hello": "ADA!"}

    seen: list[Any] = []
    bound = per_app(MetricsController, metrics=object(), flush=object, gateway=object(), extra=seen.append)
    extra = bound.extra
    extra({"type": "http"})
    assert seen == [{"type": "http"}], "the scope only: no controller passed as a first argument"


async def _logged_in(client: AsyncTestClient) -> tuple[dict[str, str], str]:
    answer = await client.post(
        "/console/login", data={"admin_key": ADMIN}, headers={"origin": BASE}, follow_redirects=False
    )
    assert answer.status_code == 303, answer.text
    match = re.search(COOKIE + r"=([^;]+);", answer.headers["set-cookie"])
    assert match
    client.cookies.clear()
    cookie = {"cookie": f"{COOKIE}={match.group(1)}"}
    page = await client.get("/console/fleet", headers=cookie)
    csrf = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
    assert page.status_code == 200 and csrf, page.text
    return cookie, csrf.group(1)


async def test_the_console_reads_and_acts_through_its_apps_admin_handlers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SWITCHYARD_ADMIN_KEY", ADMIN)
    admin = {"authorization": f"Bearer {ADMIN}"}
    async with AsyncTestClient(create_app(settings_from_text(CONFIG)), base_url=BASE) as client:
        cookie, csrf = await _logged_in(client)
        action = {**cookie, "origin": BASE, "x-csrf-token": csrf}
        for page in ("fleet", "fleet/fragment", "costs?window=15m", "routing", "keys", "keys/fragment"):
            answer = await client.get(f"/console/{page}", headers=cookie)
            assert answer.status_code == 200, (page, answer.text)
        fleet = (await client.get("/console/fleet/fragment", headers=cookie)).text
        assert "h100-a" in fleet and "h100-b" in fleet

        drained = await client.post("/console/backends/h100-b/drain", headers=action)
        assert drained.status_code == 200 and drained.json()["draining"] is True
        backends = (await client.get("/admin/v1/backends", headers=admin)).json()["data"]
        assert {b["name"]: b["draining"] for b in backends} == {"h100-a": False, "h100-b": True}
        unknown = await client.post("/console/backends/nope/undrain", headers=action)
        assert unknown.status_code == 404 and "known: h100-a, h100-b" in unknown.json()["error"]["message"]

        created = await client.post("/console/keys", headers=action, content=b'{"name": "ci"}')
        assert created.status_code == 201, created.text
        key_id = created.json()["id"]
        listed = (await client.get("/admin/v1/keys", headers=admin)).json()["data"]
        assert [k["id"] for k in listed] == [key_id]
        revoked = await client.post(f"/console/keys/{key_id}/revoke", headers=action)
        assert revoked.status_code == 200 and revoked.json()["revoked"] is True
        assert "ci" in (await client.get("/console/keys/fragment", headers=cookie)).text

        body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
        explained = await client.post("/console/explain?endpoint=chat", headers=action, content=body)
        assert explained.status_code == 200 and "h100-a" in explained.text
