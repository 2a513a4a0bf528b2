"""Refusals of the market's services. Each carries the HTTP status the API answers
with and, where one input is at fault, the field it names. Messages are safe to
show a user: they never reveal another party's sealed bid."""

from __future__ import annotations


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
