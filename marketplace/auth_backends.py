"""Password checks that hold no database connection while they hash.

PBKDF2 (Django's default hasher) costs a fraction of a second of CPU by design. A login
that held its database connection meanwhile let 60 concurrent wrong passwords use 60
connections at once and exhaust PostgreSQL's max_connections (issue 10, item 5). Here
the user's row is read, the connection is given back (to the pool, or closed), and only
then is the password hashed; a successful login takes a connection again for what
follows (session, token). Inside a transaction (ATOMIC_REQUESTS, a test's) the
connection stays: giving it back would end the transaction.
"""

from __future__ import annotations

from django.contrib.auth import backends, get_user_model
from django.db import connections, router


def release_connection(alias: str = "default") -> bool:
    """Give `alias`'s connection of this thread back when nothing depends on it (PostgreSQL,
    outside any transaction); the next query takes one again. True when it was given
    back. SQLite's connection (the demo's file) is no scarce resource and stays."""
    conn = connections[alias]
    if (conn.vendor != "postgresql" or conn.connection is None or conn.in_atomic_block
            or not conn.get_autocommit()):
        return False
    conn.close()
    return True


class ModelBackend(backends.ModelBackend):
    """Django's ModelBackend (same users, same timing for unknown usernames), hashing with
    the connection given back."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        user_model = get_user_model()
        if username is None:
            username = kwargs.get(user_model.USERNAME_FIELD)
        if username is None or password is None:
            return None
        try:
            user = user_model._default_manager.get_by_natural_key(username)
        except user_model.DoesNotExist:
            release_connection(router.db_for_read(user_model))
            # as Django does: hash anyway, so an unknown username takes as long as a wrong
            # password (no timing tells which usernames exist)
            user_model().set_password(password)
            return None
        release_connection(router.db_for_read(user_model))
        if user.check_password(password) and self.user_can_authenticate(user):
            return user
        return None
