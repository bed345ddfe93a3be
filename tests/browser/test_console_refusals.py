"""Without the admin key nothing in the console answers; an action from another origin is refused, both
from a real page on another origin in chromium and from a client forging every header but the Origin."""

from __future__ import annotations

import contextlib
import re
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.harness import ADMIN_KEY, clean_redis, gateway_config, login
from tests.support import RecordingBackend, running_gateway

MODEL = "echo-model"
PAGES = ["/console/fleet", "/console/costs", "/console/routing", "/console/keys", "/console/fleet/fragment",
         "/console/keys/fragment"]  # fmt: skip
ACTIONS = ["/console/backends/echo-0/drain", "/console/backends/echo-0/undrain", "/console/keys",
           "/console/keys/key_0000000000000000/revoke", "/console/explain", "/console/logout"]  # fmt: skip


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(a gateway with the admin key, one in `auth.mode: open` without any)."""
    prefix = f"btest-refuse-{uuid.uuid4().hex[:10]}"
    try:
        with RecordingBackend(MODEL) as backend, contextlib.ExitStack() as stack:
            pools = [
                {
                    "name": "echo",
                    "vendor": "nvidia",
                    "accelerator": "h100",
                    "price_per_gpu_hour": 2.0,
                    "backends": [
                        {"name": "echo-0", "url": backend.url, "models": [MODEL], "max_model_len": 4096}
                    ],
                }
            ]
            guarded = tmp_path_factory.mktemp("refuse-keyed")
            config = gateway_config(pools, prefix, guarded)
            keyed = stack.enter_context(
                running_gateway(config, guarded, env={"SWITCHYARD_ADMIN_KEY": ADMIN_KEY})
            )
            bare = tmp_path_factory.mktemp("refuse-open")
            open_config = {**gateway_config(pools, prefix + "-open", bare), "auth": {"mode": "open"}}
            env = {"SWITCHYARD_ADMIN_KEY": ""}
            opened = stack.enter_context(running_gateway(open_config, bare, env=env))
            yield keyed, opened
    finally:
        clean_redis(prefix)
        clean_redis(prefix + "-open")


def _session(base: str) -> tuple[dict[str, str], str]:
    """A logged-in session's cookie header and its CSRF token, by plain HTTP."""
    with httpx.Client(base_url=base, trust_env=False) as client:
        answer = client.post("/console/login", data={"admin_key": ADMIN_KEY}, headers={"origin": base})
        assert answer.status_code == 303
        cookie = answer.headers["set-cookie"].split(";")[0]
        page = client.get("/console/fleet", headers={"cookie": cookie})
    csrf = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
    assert csrf is not None
    return {"cookie": cookie}, csrf.group(1)


def _draining(base: str) -> bool:
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    body = httpx.get(base + "/admin/v1/backends", headers=headers, trust_env=False).json()
    return bool(body["data"][0]["draining"])


def test_every_page_and_action_refused_without_a_session(gateways: tuple[str, str]) -> None:
    base, _ = gateways
    with httpx.Client(base_url=base, trust_env=False) as client:
        for path in PAGES:
            answer = client.get(path)
            assert answer.status_code == 401, path
            assert "csrf-token" not in answer.text and "Log in" in answer.text
        for path in ACTIONS:
            answer = client.post(path, headers={"origin": base}, json={})
            assert answer.status_code == 401, (path, answer.text)
            assert answer.json()["error"]["code"] == "no_session"
        # The admin key as a bearer header is not a console session.
        bearer = {"authorization": f"Bearer {ADMIN_KEY}", "origin": base}
        assert client.get("/console/fleet", headers=bearer).status_code == 401
        wrong = client.post("/console/login", data={"admin_key": "sy-not-it"}, headers={"origin": base})
        assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
        forged = client.get("/console/fleet", headers={"cookie": "sy_console=9999999999.abc.def"})
        assert forged.status_code == 401
    assert not _draining(base)


def test_console_without_an_admin_key_says_so_and_refuses(gateways: tuple[str, str]) -> None:
    _, bare = gateways
    with httpx.Client(base_url=bare, trust_env=False) as client:
        for path in [*PAGES, "/console/login"]:
            answer = client.get(path)
            assert answer.status_code == 503, path
            assert "needs an admin key" in answer.text
        for path in [*ACTIONS, "/console/login"]:
            answer = client.post(path, headers={"origin": bare}, data={"admin_key": "anything"})
            assert answer.status_code == 503, path


def test_action_with_a_foreign_origin_or_no_csrf_token_is_refused(gateways: tuple[str, str]) -> None:
    base, _ = gateways
    cookie, csrf = _session(base)
    drain = "/console/backends/echo-0/drain"
    with httpx.Client(base_url=base, trust_env=False) as client:
        foreign = {**cookie, "x-csrf-token": csrf, "origin": "http://evil.example"}
        answer = client.post(drain, headers=foreign)
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "cross_origin"
        referer_only = {**cookie, "x-csrf-token": csrf, "referer": "http://evil.example/console/fleet"}
        assert client.post(drain, headers=referer_only).status_code == 403
        no_origin = {**cookie, "x-csrf-token": csrf}
        assert client.post(drain, headers=no_origin).status_code == 403
        no_token = {**cookie, "origin": base}
        answer = client.post(drain, headers=no_token)
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "csrf"
        other_token = {**cookie, "origin": base, "x-csrf-token": _session(base)[1]}
        assert client.post(drain, headers=other_token).status_code == 403
        assert not _draining(base)
        # The same request from this origin with the token is allowed: the refusals above were the checks.
        allowed = client.post(drain, headers={**cookie, "origin": base, "x-csrf-token": csrf})
        assert allowed.status_code == 200 and _draining(base)
        undrain = client.post(
            drain.replace("drain", "undrain"), headers={**cookie, "origin": base, "x-csrf-token": csrf}
        )
        assert undrain.status_code == 200 and not _draining(base)


class _AttackerPage:
    """A page on another origin (localhost instead of 127.0.0.1, another port) that posts to the console."""

    def __init__(self, target: str) -> None:
        page = (
            "<!doctype html><html><body>"
            f'<form id="f" method="post" action="{target}/console/backends/echo-0/drain">'
            '<input name="csrf" value="guess"></form>'
            "<script>document.getElementById('f').submit()</script></body></html>"
        ).encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://localhost:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_form_posted_from_another_origin_in_the_browser_is_refused(
    gateways: tuple[str, str], new_page: Any, tmp_path: Path
) -> None:
    base, _ = gateways
    login(new_page, base)
    attacker = _AttackerPage(base)
    try:
        with new_page.expect_response(lambda r: r.url.endswith("/drain")) as posted:
            new_page.goto(attacker.url)
        assert posted.value.status in (401, 403)
    finally:
        attacker.close()
    assert not _draining(base)
