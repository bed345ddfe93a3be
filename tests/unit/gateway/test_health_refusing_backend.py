"""A backend that stops accepting new connections while an old keep-alive connection still answers is
taken out of routing by the health check within two checks, and `/ready`, `/admin/v1/backends` and the
console's fleet view say what routing does."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.config.settings import settings_from_text

INTERVAL = 0.3
ADMIN = "sy-health-admin-" + "k3J9q2Lw8XvT5mZr1YbN6cPa4HdQ7sEf"


class HalfDeadBackend:
    """A real TCP HTTP/1.1 server answering `200 {}` on keep-alive connections; `stop_accepting` closes
    the listening socket, so new connections are refused while the ones already open go on answering."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._connections: list[socket.socket] = []
        self._stopped = threading.Event()
        self._accepting = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> HalfDeadBackend:
        self._accepting.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self.stop_accepting()
        for conn in self._connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def stop_accepting(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._connections.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buffer = b""
        with contextlib.suppress(OSError):
            while not self._stopped.is_set():
                while b"\r\n\r\n" not in buffer:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                while len(buffer) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                buffer = buffer[length:]
                body = b"{}"
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                )


def _config(half_dead: str, steady: str) -> str:
    return f"""
gateway: {{health: {{interval: {INTERVAL}, timeout: 0.5, unhealthy_after: 2}}}}
telemetry: {{access_log: {{enabled: false}}}}
pools:
  - name: h100
    vendor: nvidia
    accelerator: h100
    price_per_gpu_hour: 2.9
    backends:
      - {{name: half-dead, url: "{half_dead}", models: [m], max_model_len: 4096}}
      - {{name: steady, url: "{steady}", models: [m], max_model_len: 4096}}
"""


async def _console_session(client: AsyncTestClient) -> None:
    origin = str(client.base_url).rstrip("/")
    answer = await client.post(
        "/console/login", data={"admin_key": ADMIN}, headers={"origin": origin}, follow_redirects=False
    )
    assert answer.status_code == 303, answer.text


async def test_backend_refusing_new_connections_fails_its_check_and_every_view_agrees(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SWITCHYARD_ADMIN_KEY", ADMIN)
    with HalfDeadBackend() as half_dead, HalfDeadBackend() as steady:
        app = create_app(settings_from_text(_config(half_dead.url, steady.url)))
        async with AsyncTestClient(app, base_url="https://testserver.local") as client:
            admin = {"authorization": f"Bearer {ADMIN}"}
            await _console_session(client)
            rows = (await client.get("/admin/v1/backends", headers=admin)).json()["data"]
            assert all(r["routable"] for r in rows)
            await asyncio.sleep(INTERVAL * 1.5)  # the health check now holds a pooled connection to each

            half_dead.stop_accepting()
            stopped = time.monotonic()
            with socket.socket() as probe:
                assert probe.connect_ex(("127.0.0.1", int(half_dead.url.rsplit(":", 1)[1]))) != 0
            backend = next(b for b in app.plugins.get("SwitchyardPlugin").pipeline.catalog.backends
                           if b.name == "half-dead")  # fmt: skip
            for _ in range(int((2 * INTERVAL + 0.5) / 0.02)):  # two checks, and slack for a busy machine
                if not backend.health_ok:
                    break
                await asyncio.sleep(0.02)
            assert time.monotonic() - stopped < 2 * INTERVAL + 1.0
            assert not backend.health_ok, "still passing its health check over the old connection"
            assert not backend.healthy

            rows = (await client.get("/admin/v1/backends", headers=admin)).json()["data"]
            routable = {r["name"] for r in rows if r["routable"]}
            assert routable == {"steady"}
            assert next(r for r in rows if r["name"] == "half-dead")["healthy"] is False

            ready = (await client.get("/ready")).json()
            assert ready["backends_serving"] == len(routable) == 1
            assert ready["backends_healthy"] == 1

            fragment = (await client.get("/console/fleet/fragment")).text
            assert "1/2 routable" in fragment
            assert '<span class="state failing">failing</span>' in fragment
