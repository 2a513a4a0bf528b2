"""Passwords are hashed with no database connection held (marketplace/auth_backends.py),
and the test process itself runs on the connection pool (GPUMARKET_DB_POOL)."""

from __future__ import annotations

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher, get_hasher
from django.db import connection

from tests.conftest import require_or_skip
from tests.support.api import client_for


def seen() -> list[bool]:
    """The notes of the WatchingHasher class Django loaded from HASHER (pytest may import
    this module a second time, under another name)."""
    return type(get_hasher(WatchingHasher.algorithm)).seen

HASHER = "tests.marketplace.test_auth_backends.WatchingHasher"
PASSWORD = "a fine long passphrase"


class WatchingHasher(PBKDF2PasswordHasher):
    """PBKDF2 (few iterations), noting in `seen`, for each hash computed, whether this
    thread held a database connection meanwhile."""

    algorithm = "pbkdf2_watching"
    iterations = 1000
    seen: list[bool] = []

    def encode(self, password, salt, iterations=None):
        self.seen.append(connection.connection is not None)
        return super().encode(password, salt, iterations)


@pytest.fixture
def watching(settings):
    settings.PASSWORD_HASHERS = [HASHER]
    user = get_user_model().objects.create_user("frank", password=PASSWORD)
    seen().clear()
    return user


@pytest.mark.django_db(transaction=True)
def test_logins_hash_the_password_with_no_connection_held(watching):
    assert authenticate(username="frank", password="wrong") is None
    assert authenticate(username="nobody", password="wrong") is None  # hashed all the same
    assert authenticate(username="frank", password=PASSWORD) == watching
    r = client_for().post("/api/v1/auth/token/", {"username": "frank", "password": "wrong"},
                          format="json")
    assert r.status_code == 400
    r = client_for().post("/api/v1/auth/token/", {"username": "frank", "password": PASSWORD},
                          format="json")
    assert r.status_code == 200 and r.json()["token"]
    assert seen() == [False] * 5


@pytest.mark.django_db(transaction=True)
def test_signup_hashes_the_password_with_no_connection_held(watching):
    r = client_for().post("/api/v1/signup/", {"username": "gina", "password": PASSWORD},
                          format="json")
    assert r.status_code == 201, r.content
    assert seen() == [False]
    assert get_user_model().objects.get(username="gina").check_password(PASSWORD)


@pytest.mark.django_db
def test_inside_a_transaction_the_connection_stays(watching):
    """A test's (or ATOMIC_REQUESTS') transaction is never ended by a login."""
    assert connection.in_atomic_block
    assert authenticate(username="frank", password=PASSWORD) == watching
    assert seen() == [True]
    assert get_user_model().objects.filter(username="frank").exists()


@pytest.mark.django_db
def test_the_tests_run_on_the_pool_against_the_test_database():
    if connection.vendor != "postgresql":
        require_or_skip("the pool is PostgreSQL's: DATABASE_URL is not PostgreSQL")
    assert connection.pool is not None
    assert connection.pool.max_size >= 24  # tests/conftest.py: room for the threaded tests
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_database()")
        assert cursor.fetchone()[0].startswith("test_")
