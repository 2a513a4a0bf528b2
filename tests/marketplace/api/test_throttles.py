"""Login and signup limits of the API (marketplace/api/throttles.py): 429 with Retry-After
per client address, and per username across addresses, on the real cache (Redis when
REDIS_URL is set). Before, 150 wrong passwords drew neither a 429 nor a lockout."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from tests.support.api import client_for

pytestmark = pytest.mark.django_db

PASSWORD = "a fine long passphrase"
TOKEN = "/api/v1/auth/token/"


def login(username: str, password: str, address: str = "10.0.0.1", **headers):
    return client_for().post(TOKEN, {"username": username, "password": password},
                             format="json", REMOTE_ADDR=address, **headers)


def assert_429(response) -> int:
    assert response.status_code == 429, (response.status_code, response.content)
    wait = int(response["Retry-After"])
    assert wait >= 1
    assert set(response.json()) == {"detail"} and response.json()["detail"]
    return wait


def test_token_logins_are_limited_per_client_address():
    limit = int(settings.GPUMARKET_LOGIN_RATE.split("/")[0])
    for i in range(limit):  # each under another username: this is the address's limit
        assert login(f"guess{i}", "wrong").status_code == 400
    wait = assert_429(login("guess-last", "wrong"))
    assert wait <= 60
    assert login("guess-last", "wrong", address="10.0.0.2").status_code == 400


def test_x_forwarded_for_does_not_make_a_new_client():
    """No proxy is trusted by default (GPUMARKET_NUM_PROXIES=0): a made-up X-Forwarded-For
    on every attempt still counts against the connection's own address."""
    limit = int(settings.GPUMARKET_LOGIN_RATE.split("/")[0])
    for i in range(limit):
        r = login(f"guess{i}", "wrong", HTTP_X_FORWARDED_FOR=f"203.0.113.{i}")
        assert r.status_code == 400
    assert_429(login("guess-last", "wrong", HTTP_X_FORWARDED_FOR="203.0.113.250"))


def test_failed_logins_lock_the_username_from_every_address_for_one_window_at_most():
    get_user_model().objects.create_user("alice", password=PASSWORD)
    get_user_model().objects.create_user("bob", password=PASSWORD)
    failures = settings.GPUMARKET_LOGIN_LOCKOUT_FAILURES
    for i in range(failures):
        assert login("alice", "wrong", address=f"10.1.0.{i}").status_code == 400
    # locked: even the right password, from an address never seen, in another letter case
    wait = assert_429(login("ALICE", PASSWORD, address="10.2.0.1"))
    assert wait <= settings.GPUMARKET_LOGIN_LOCKOUT_SECONDS  # bounded: never longer
    assert "username" in login("alice", PASSWORD, address="10.2.0.2").json()["detail"]
    # other users are not affected
    r = login("bob", PASSWORD, address="10.2.0.1")
    assert r.status_code == 200 and r.json()["token"]


def test_successful_logins_do_not_count_toward_the_lockout():
    get_user_model().objects.create_user("carol", password=PASSWORD)
    failures = settings.GPUMARKET_LOGIN_LOCKOUT_FAILURES
    for i in range(failures + 3):
        assert login("carol", PASSWORD, address=f"10.3.0.{i}").status_code == 200
    for i in range(failures - 1):
        assert login("carol", "wrong", address=f"10.4.0.{i}").status_code == 400
    assert login("carol", PASSWORD, address="10.5.0.1").status_code == 200


def test_signups_are_limited_per_client_address():
    limit = int(settings.GPUMARKET_SIGNUP_RATE.split("/")[0])
    for i in range(limit):
        r = client_for().post("/api/v1/signup/", {"username": f"new{i}", "password": PASSWORD},
                              format="json", REMOTE_ADDR="10.6.0.1")
        assert r.status_code == 201, r.content
    r = client_for().post("/api/v1/signup/", {"username": "one-more", "password": PASSWORD},
                          format="json", REMOTE_ADDR="10.6.0.1")
    assert_429(r)
    assert not get_user_model().objects.filter(username="one-more").exists()
