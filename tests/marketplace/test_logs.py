"""Errors and secrets in the logs (marketplace/logs.py, settings.LOGGING): with DEBUG=0 an
unexpected error's traceback is logged to stderr with the request id that the answer
carries (header and body, never the traceback); no API token or websocket ticket ever
reaches uvicorn's access log. A real uvicorn process on the test database, DEBUG=0."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import pytest
from django.test import Client, override_settings
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.conftest import ROOT
from tests.support.net import free_port
from tests.support.processes import child_env
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "a long horse battery"


class Server:
    """`uvicorn marketplace.asgi:application` (the README's command) with DEBUG=0 and the
    boom URL added (tests/support/boom_settings.py); stdout and stderr into one file."""

    def __init__(self, tmp_path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / "uvicorn.log"
        env = child_env(DEBUG="0", SECRET_KEY="x" * 50, GPUMARKET_DEV_CREDIT="0",
                        DJANGO_SETTINGS_MODULE="tests.support.boom_settings",
                        ALLOWED_HOSTS="127.0.0.1,localhost", GPUMARKET_VAR_DIR=str(tmp_path))
        self._log = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "marketplace.asgi:application", "--host",
             "127.0.0.1", "--port", str(self.port), "--ws-per-message-deflate", "false"],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        wait_until("uvicorn to answer", self._up, timeout=60)

    def _up(self) -> bool:
        assert self.proc.poll() is None, self.log_path.read_text()
        try:
            return httpx.get(f"{self.base}/api/v1/gpu-classes/", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> str:
        """End the server; everything it logged."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)
        self._log.close()
        return self.log_path.read_text()


@pytest.fixture
def server(tmp_path):
    srv = Server(tmp_path)
    yield srv
    srv.stop()


def test_a_500_logs_its_traceback_with_the_request_id_the_answer_carries(server):
    r = httpx.get(f"{server.base}/api/v1/boom/", headers={"X-Request-ID": "test-req-42"})
    assert r.status_code == 500
    assert r.headers["x-request-id"] == "test-req-42"
    assert r.json() == {"detail": "server error: the request failed; it is logged as "
                                  "request test-req-42", "request_id": "test-req-42"}
    # no sane id from the client: one is made up, and still the same in header and body
    bad = httpx.get(f"{server.base}/api/v1/boom/", headers={"X-Request-ID": "a b;<script>"})
    made = bad.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", made) and bad.json()["request_id"] == made
    page = httpx.get(f"{server.base}/boom/")
    assert page.status_code == 500 and page.headers["content-type"].startswith("text/html")
    page_id = page.headers["x-request-id"]
    assert f'<code id="request-id">{page_id}</code>' in page.text
    for answer in (r, bad, page):
        assert "Traceback" not in answer.text and "forced bug" not in answer.text

    log = server.stop()
    for request_id, path in (("test-req-42", "/api/v1/boom/"), (made, "/api/v1/boom/"),
                             (page_id, "/boom/")):
        line = f"ERROR django.request [{request_id}]: Internal Server Error: {path}"
        assert line in log, log
        after = log[log.index(line):]
        assert after.index("Traceback (most recent call last)") < after.index(
            "RuntimeError: forced bug for the log test")
    assert "a b;<script>" not in log


def test_no_token_or_ticket_reaches_the_access_log(server):
    ws_base = server.base.replace("http://", "ws://")
    r = httpx.post(f"{server.base}/api/v1/signup/",
                   json={"username": "alice", "password": PASSWORD})
    assert r.status_code == 201, r.text
    token = r.json()["token"]
    auth = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{server.base}/api/v1/me/", headers=auth).json()["username"] == "alice"
    r = httpx.post(f"{server.base}/api/v1/ws-tickets/", headers=auth)
    assert r.status_code == 201, r.text
    ticket = r.json()["ticket"]
    with connect(f"{ws_base}/ws/me/?ticket={ticket}", origin=server.base,
                 open_timeout=10) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "snapshot"
    # a client that still puts its token in the URL is refused, and told why
    with connect(f"{ws_base}/ws/me/?token={token}", origin=server.base,
                 open_timeout=10) as ws:
        assert "credentials in the URL are refused" in json.loads(ws.recv(timeout=10))["detail"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd.code == 4400
    # and over HTTP a token in the URL authenticates nothing
    assert httpx.get(f"{server.base}/api/v1/me/", params={"token": token}).status_code == 401
    assert httpx.get(f"{server.base}/api/v1/auth/tokens/", headers=auth).status_code == 200

    log = server.stop()
    assert '"GET /api/v1/me/?token=[redacted] HTTP/1.1" 401' in log, log
    assert "/ws/me/?ticket=[redacted]" in log and "/ws/me/?token=[redacted]" in log, log
    assert token not in log and token[4:] not in log
    assert ticket not in log and ticket[4:] not in log


def test_every_answer_carries_a_request_id():
    client = Client()
    r = client.get("/api/v1/gpu-classes/", HTTP_X_REQUEST_ID="abc-123")
    assert r["X-Request-ID"] == "abc-123"
    r = client.get("/api/v1/gpu-classes/", HTTP_X_REQUEST_ID="x" * 65)  # too long: replaced
    assert re.fullmatch(r"[0-9a-f]{32}", r["X-Request-ID"])


@override_settings(DEBUG=False, ROOT_URLCONF="tests.support.boom_urls")
def test_with_debug_off_the_500_names_the_request_id_and_nothing_else():
    client = Client(raise_request_exception=False)
    r = client.get("/api/v1/boom/", HTTP_X_REQUEST_ID="req-7")
    assert r.status_code == 500 and r["X-Request-ID"] == "req-7"
    assert r.json()["request_id"] == "req-7" and "RuntimeError" not in r.content.decode()
