"""Refusals of the market's services. Each carries the HTTP status the API answers
with and, where one input is at fault, the field it names. Messages are safe to
show a user: they never reveal another party's sealed bid."""

from __future__ import annotations

from django.conf import settings


class MarketError(Exception):
    status = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(MarketError):
    status = 400


class PermissionDenied(MarketError):
    status = 403


class NotFound(MarketError):
    status = 404


class Conflict(MarketError):
    status = 409


class MarketBusy(MarketError):
    """The market's lock was not had within GPUMARKET_MARKET_LOCK_TIMEOUT_MS: nothing was
    written; the caller may retry after `retry_after` seconds."""

    status = 503
    retry_after = 1


def busy_message() -> str:
    return (f"the market is busy: its order book stayed locked for "
            f"{settings.GPUMARKET_MARKET_LOCK_TIMEOUT_MS} ms; nothing was written, retry in "
            "a second")


def is_lock_timeout(exc: BaseException) -> bool:
    """Whether `exc` is PostgreSQL's lock_timeout firing (SQLSTATE 55P03)."""
    return getattr(exc.__cause__, "sqlstate", None) == "55P03"
