"""API tokens (marketplace/api_tokens.py): hashed at rest, expiring, listed and revoked by
their owner; each signup and login issues a new one, shown once. Real PostgreSQL."""

from __future__ import annotations

import hashlib
import importlib
from datetime import timedelta

import pytest
from django.apps import apps
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace import api_tokens
from marketplace.models import ApiToken
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

PASSWORD = "a long horse battery"


def _client(token: str | None = None, keyword: str = "Token") -> APIClient:
    client = APIClient()
    client.raise_request_exception = False
    if token is not None:
        client.credentials(HTTP_AUTHORIZATION=f"{keyword} {token}")
    return client


def _signup(username: str = "alice") -> dict:
    r = _client().post("/api/v1/signup/", {"username": username, "password": PASSWORD},
                       format="json")
    assert r.status_code == 201, r.content
    return r.json()


def _login(username: str = "alice", **extra) -> dict:
    r = _client().post("/api/v1/auth/token/",
                       {"username": username, "password": PASSWORD, **extra}, format="json")
    assert r.status_code == 200, r.content
    return r.json()


def _rows_containing(text: str) -> list[str]:
    """Every table of the database whose rows, as text, contain `text`."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT table_name FROM information_schema.tables "
                       "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'")
        tables = [t for (t,) in cursor.fetchall()]
        found = []
        for table in tables:
            cursor.execute(f'SELECT count(*) FROM "{table}" AS t WHERE t::text LIKE %s',
                           [f"%{text}%"])
            if cursor.fetchone()[0]:
                found.append(table)
    return found


def test_tokens_are_stored_hashed_never_in_clear():
    signed_up = _signup()
    logged_in = _login()
    for token in (signed_up["token"], logged_in["token"]):
        assert token.startswith("gmu_") and len(token) > 40
        assert _client(token).get("/api/v1/me/").json()["username"] == "alice"
        assert _rows_containing(token) == []  # no table, no column holds it
        row = ApiToken.objects.get(key_hash=hashlib.sha256(token.encode()).hexdigest())
        assert row.prefix == token[:10]


def test_each_signup_and_login_issues_a_new_token_valid_ttl_days(settings):
    settings.GPUMARKET_API_TOKEN_TTL_DAYS = 7
    first = _signup()
    second = _login(name="laptop")
    assert first["token"] != second["token"]
    assert first["expires_at"] == first["token_expires_at"]  # login's name, and the old
    for body, key in ((first, "expires_at"), (second, "expires_at")):
        expires = timezone.datetime.fromisoformat(body[key].replace("Z", "+00:00"))
        assert abs(expires - (timezone.now() + timedelta(days=7))) < timedelta(minutes=5)
    # both work, each on its own
    assert _client(first["token"], "Bearer").get("/api/v1/me/").status_code == 200
    assert _client(second["token"]).get("/api/v1/me/").status_code == 200
    assert ApiToken.objects.get(pk=second["id"]).name == "laptop"


def test_an_expired_token_is_a_401_saying_so():
    user = UserFactory()
    issued = api_tokens.issue(user=user)
    assert _client(issued.key).get("/api/v1/me/").status_code == 200
    ApiToken.objects.filter(pk=issued.token.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1))
    for keyword in ("Token", "Bearer"):
        r = _client(issued.key, keyword).get("/api/v1/me/")
        assert r.status_code == 401
        assert r.json() == {"detail": "token expired"}


def test_an_unknown_token_is_a_401_invalid_token():
    r = _client("gmu_" + "x" * 43).get("/api/v1/me/")
    assert r.status_code == 401 and r.json() == {"detail": "invalid token"}


def test_the_list_shows_your_tokens_never_a_token_itself():
    _signup()
    logged_in = _login(name="ci")
    _signup("bob")
    r = _client(logged_in["token"]).get("/api/v1/auth/tokens/")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["count"] == 2  # alice's two, none of bob's
    rows = body["results"]
    assert [t["name"] for t in rows] == ["ci", "signup"]  # newest first
    assert set(rows[0]) == {"id", "name", "prefix", "created_at", "last_used_at",
                            "expires_at", "expired", "current"}
    assert [t["current"] for t in rows] == [True, False]
    assert rows[0]["prefix"] == logged_in["token"][:10] and rows[0]["last_used_at"]
    assert not any(t["expired"] for t in rows)
    assert logged_in["token"] not in r.content.decode()


def test_a_revoked_token_is_refused_at_once():
    signed_up = _signup()
    other = _login()
    first = ApiToken.objects.get(name="signup")
    r = _client(other["token"]).delete(f"/api/v1/auth/tokens/{first.pk}/")
    assert r.status_code == 200 and r.json()["revoked"] is True
    r = _client(signed_up["token"]).get("/api/v1/me/")
    assert r.status_code == 401 and r.json() == {"detail": "invalid token"}
    assert _client(other["token"]).get("/api/v1/me/").status_code == 200
    # revoking the token you call with logs that token out
    r = _client(other["token"]).delete(f"/api/v1/auth/tokens/{other['id']}/")
    assert r.status_code == 200
    assert _client(other["token"]).get("/api/v1/me/").status_code == 401


def test_another_users_token_cannot_be_revoked():
    alice = _signup()
    bob = _signup("bob")
    bobs = ApiToken.objects.get(user_id=bob["id"])
    r = _client(alice["token"]).delete(f"/api/v1/auth/tokens/{bobs.pk}/")
    assert r.status_code == 404 and r.json() == {"detail": f"you have no API token {bobs.pk}"}
    assert _client(bob["token"]).get("/api/v1/me/").status_code == 200
    assert _client().get("/api/v1/auth/tokens/").status_code == 401


def test_existing_drf_tokens_are_carried_over_hashed_and_the_clear_ones_deleted():
    """The migration (marketplace 0009): a database that had rest_framework.authtoken's
    table keeps its users' tokens working, and no longer holds them in clear."""
    user = UserFactory()
    legacy = "0123456789abcdef0123456789abcdef01234567"
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, "
                       "created timestamptz NOT NULL, user_id integer NOT NULL)")
        cursor.execute("INSERT INTO authtoken_token VALUES (%s, %s, %s)",
                       [legacy, timezone.now() - timedelta(days=400), user.pk])
    migration = importlib.import_module("marketplace.migrations.0010_api_tokens_hashed")
    with connection.schema_editor() as editor:
        migration.carry_over_drf_tokens(apps, editor)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM authtoken_token")
        assert cursor.fetchone()[0] == 0
    assert _rows_containing(legacy) == []
    r = _client(legacy).get("/api/v1/me/")
    assert r.status_code == 200 and r.json()["id"] == user.pk
    token = ApiToken.objects.get(user=user)
    assert token.name == "carried over" and token.created_at < timezone.now() - timedelta(days=399)
    assert token.expires_at > timezone.now() + timedelta(days=29)
