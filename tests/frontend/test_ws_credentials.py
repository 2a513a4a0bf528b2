"""Websocket credentials never in a URL: `?token=` is refused on every websocket path
(frontend/ws_auth.py, saying why); /ws/me/ takes a single-use, expiring ticket from
POST /api/v1/ws-tickets/ (stored hashed) or an Authorization header. The real ASGI
application through Channels' communicator, real PostgreSQL and channel layer."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from marketplace import api_tokens
from marketplace.models import ApiToken, WsTicket
from tests.factories import UserFactory, api_token, registered_node
from tests.frontend.conftest import connect, recv
from tests.support.api import client_for

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("clean_channel_layer")]


def _refused(path: str):
    """(connected, the error frame, the close message) of a websocket to `path`."""
    async def scenario():
        comm, connected, _ = await connect(path)
        frame = await recv(comm) if connected else None
        closed = await comm.receive_output(timeout=5)
        await comm.wait()
        return connected, frame, closed

    return async_to_sync(scenario)()


def _me(path: str, *headers):
    """(connected, the first frame or the close code) of /ws/me/ at `path`."""
    async def scenario():
        comm, connected, detail = await connect(path, *headers)
        if not connected:
            return False, detail
        first = await recv(comm)
        await comm.disconnect()
        return True, first

    return async_to_sync(scenario)()


@pytest.mark.parametrize(("where", "param"), [
    ("me", "token"), ("me", "access_token"), ("me", "api_key"), ("me", "Token"),
    ("market", "token"), ("auction", "token"), ("runner", "token"), ("runner", "key")])
def test_a_credential_in_the_url_is_refused_on_every_websocket_path(where, param):
    if where == "runner":
        _provider, _node, key = registered_node()
    else:
        key = api_token(UserFactory())
    path = {"me": "/ws/me/", "market": "/ws/markets/h100-sxm-80gb/",
            "auction": "/ws/auctions/1/", "runner": "/ws/runner/"}[where]
    connected, frame, closed = _refused(f"{path}?{param}={key}")
    assert connected  # accepted only to say why
    assert frame["type"] == "error"
    assert f"'{param}' in the URL" in frame["detail"]
    assert "POST /api/v1/ws-tickets/" in frame["detail"]
    assert closed["type"] == "websocket.close" and closed["code"] == 4400
    assert "credentials in the URL are refused" in closed["reason"]
    assert key not in json.dumps(frame) + closed["reason"]


def test_a_ticket_opens_one_connection_once():
    user = UserFactory()
    r = client_for(user).post("/api/v1/ws-tickets/")
    assert r.status_code == 201, r.content
    body = r.json()
    assert set(body) == {"ticket", "expires_at"} and body["ticket"].startswith("gmt_")
    # stored hashed only
    row = WsTicket.objects.get()
    assert row.key_hash == hashlib.sha256(body["ticket"].encode()).hexdigest()
    assert body["ticket"] not in str(WsTicket.objects.values().get())
    connected, snap = _me(f"/ws/me/?ticket={body['ticket']}")
    assert connected and snap["type"] == "snapshot" and snap["user"] == user.pk
    assert _me(f"/ws/me/?ticket={body['ticket']}") == (False, 4401)  # used up
    assert not WsTicket.objects.exists()


def test_a_ticket_expires(settings):
    settings.GPUMARKET_WS_TICKET_SECONDS = 30
    user = UserFactory()
    old, expires_at = api_tokens.issue_ticket(
        user=user, now=timezone.now() - timedelta(seconds=31))
    assert expires_at < timezone.now()
    assert _me(f"/ws/me/?ticket={old}") == (False, 4401)
    fresh, expires_at = api_tokens.issue_ticket(user=user)
    assert timedelta(seconds=25) < expires_at - timezone.now() <= timedelta(seconds=30)
    assert _me(f"/ws/me/?ticket={fresh}")[0] is True


def test_tickets_need_an_authenticated_post():
    r = client_for().post("/api/v1/ws-tickets/")
    assert r.status_code == 401
    assert not WsTicket.objects.exists()


def test_revoking_the_token_kills_its_tickets_and_its_header_use():
    user = UserFactory()
    issued = api_tokens.issue(user=user)
    header = (b"authorization", f"Bearer {issued.key}".encode())
    connected, snap = _me("/ws/me/", header)
    assert connected and snap["user"] == user.pk
    client = client_for()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issued.key}")
    ticket = client.post("/api/v1/ws-tickets/").json()["ticket"]
    ApiToken.objects.filter(pk=issued.token.pk).delete()
    assert _me(f"/ws/me/?ticket={ticket}") == (False, 4401)
    assert _me("/ws/me/", header) == (False, 4401)


def test_an_expired_token_in_the_header_is_refused():
    user = UserFactory()
    issued = api_tokens.issue(user=user, now=timezone.now() - timedelta(days=31))
    assert _me("/ws/me/", (b"authorization", f"Token {issued.key}".encode())) == (False, 4401)
