"""Users' API tokens and websocket tickets: issued once, stored hashed, expiring.

API token: `gmu_` + 43 URL-safe characters (256 random bits), shown once when issued
(signup, POST /api/v1/auth/token/). The database keeps its SHA-256 hex (as for runner
tokens, providers/models.py), its first characters (`prefix`, to tell tokens apart in
GET /api/v1/auth/tokens/), its creation and expiry (GPUMARKET_API_TOKEN_TTL_DAYS, default
30) and when it was last used (to GPUMARKET_API_TOKEN_TOUCH_SECONDS: one write per token
per that many seconds, not per request). An expired token is refused ("token expired");
a deleted one (DELETE /api/v1/auth/tokens/<id>/) is unknown at once. A lookup is one
query on the unique index of the hash.

Websocket ticket: for /ws/me/ without a session (programs, other origins): an
authenticated POST /api/v1/ws-tickets/ returns `gmt_…`, valid GPUMARKET_WS_TICKET_SECONDS
(default 30) for one connection: `/ws/me/?ticket=<ticket>`. Only its hash is stored and the
first websocket that shows it deletes it, so what an access log keeps of the URL is
worthless (and redacted anyway: marketplace/logs.py). Credentials themselves never go in
a URL: `?token=` is refused on every websocket path (frontend/ws_auth.py).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from marketplace.models import ApiToken, WsTicket

TOKEN_PREFIX = "gmu_"
TICKET_PREFIX = "gmt_"
PREFIX_CHARS = 10  # "gmu_" and 6 random characters: enough to tell tokens apart


class TokenRefused(Exception):
    """An API token that authenticates nobody; `message` says why (one line)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def hash_key(key: str) -> str:
    """SHA-256 hex of a token or ticket: the only form stored."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Issued:
    token: ApiToken
    key: str  # the token itself: shown once, never stored


def issue(*, user, name: str = "", now: datetime | None = None) -> Issued:
    """A new API token for `user`, valid GPUMARKET_API_TOKEN_TTL_DAYS days."""
    now = now or timezone.now()
    key = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user, name=name[:100], prefix=key[:PREFIX_CHARS], key_hash=hash_key(key),
        expires_at=now + timedelta(days=settings.GPUMARKET_API_TOKEN_TTL_DAYS))
    return Issued(token=token, key=key)


def authenticate(key: str, *, now: datetime | None = None) -> ApiToken:
    """The token `key` names, with its user loaded; raises TokenRefused ("invalid token",
    "token expired", "user inactive or deleted"). Records the use (see the module doc)."""
    now = now or timezone.now()
    token = ApiToken.objects.select_related("user").filter(key_hash=hash_key(key)).first()
    if token is None:
        raise TokenRefused("invalid token")
    if token.expires_at <= now:
        raise TokenRefused("token expired")
    if not token.user.is_active:
        raise TokenRefused("user inactive or deleted")
    touch(token.pk, token.last_used_at, now)
    return token


def user_ids(keys: set[str], *, now: datetime | None = None) -> dict[str, int]:
    """{key: user id} for those of `keys` that are valid tokens of active users (the bid
    batcher's group lookup: one query for the whole group). Refused keys are left out."""
    by_hash = {hash_key(k): k for k in keys}
    return {by_hash[h]: user_id for h, user_id in user_ids_by_hash(set(by_hash), now=now).items()}


def user_ids_by_hash(hashes: set[str], *, now: datetime | None = None) -> dict[str, int]:
    """user_ids for keys given by their hash_key (the bid queue carries hashes, never a
    key: marketplace/api/bid_queue.py)."""
    now = now or timezone.now()
    rows = (ApiToken.objects.filter(key_hash__in=hashes, user__is_active=True,
                                    expires_at__gt=now)
            .values_list("key_hash", "user_id", "pk", "last_used_at"))
    found = {}
    for key_hash, user_id, pk, last_used_at in rows:
        found[key_hash] = user_id
        touch(pk, last_used_at, now)
    return found


def touch(pk: int, last_used_at: datetime | None, now: datetime) -> None:
    """Set last_used_at, at most once per GPUMARKET_API_TOKEN_TOUCH_SECONDS."""
    every = timedelta(seconds=settings.GPUMARKET_API_TOKEN_TOUCH_SECONDS)
    if last_used_at is None or now - last_used_at >= every:
        ApiToken.objects.filter(pk=pk).update(last_used_at=now)


def issue_ticket(*, user, api_token: ApiToken | None = None,
                 now: datetime | None = None) -> tuple[str, datetime]:
    """(ticket, expires_at): a single-use websocket ticket for `user`. Expired tickets
    of anyone are deleted on the way (an indexed delete)."""
    now = now or timezone.now()
    WsTicket.objects.filter(expires_at__lte=now).delete()
    key = TICKET_PREFIX + secrets.token_urlsafe(32)
    expires_at = now + timedelta(seconds=settings.GPUMARKET_WS_TICKET_SECONDS)
    WsTicket.objects.create(user=user, api_token=api_token, key_hash=hash_key(key),
                            expires_at=expires_at)
    return key, expires_at


def redeem_ticket(key: str, *, now: datetime | None = None):
    """The active user of ticket `key`, which is used up; None when it is unknown, used,
    expired or its user inactive. Of two concurrent redemptions exactly one wins (the
    one whose DELETE removed the row)."""
    now = now or timezone.now()
    row = (WsTicket.objects.filter(key_hash=hash_key(key))
           .values_list("pk", "expires_at", "user_id").first())
    if row is None:
        return None
    pk, expires_at, user_id = row
    deleted, _ = WsTicket.objects.filter(pk=pk).delete()
    if not deleted or expires_at <= now:
        return None
    return get_user_model().objects.filter(pk=user_id, is_active=True).first()
