"""The marketplace's public REST API (/api/v1/), as the buyer uses it.

Sends `Authorization: Bearer <token>`; the token is never printed, logged or in repr().
Every failure is a CliError with its exit status (config.py): 401, or no token for a
server that answers, → 3 (auth); another 4xx
→ 1 with the API's `detail` and each named field's messages in one line; no answer or a
5xx → 4. The error shape: marketplace/api/errors.py ({"detail", "errors": {field: [msg]}}).
"""

from __future__ import annotations

import re

import httpx

from . import __version__
from .config import EXIT_AUTH, EXIT_REFUSED, EXIT_UNREACHABLE, CliError

_TOKEN = re.compile(r"[\x21-\x7e]{1,1000}")


def refusal_line(status: int, data) -> str:
    """One line of an error answer: `detail`, then the other named fields' messages
    ("price: must be greater than zero; gpus: …")."""
    if not isinstance(data, dict):
        return f"the server answered {status}"
    detail = str(data.get("detail") or f"the server answered {status}")
    errors = data.get("errors")
    parts = [detail]
    if isinstance(errors, dict):
        for field, messages in errors.items():
            for message in messages if isinstance(messages, list) else [messages]:
                line = f"{field}: {message}"
                if line != detail:
                    parts.append(line)
    return "; ".join(" ".join(p.split()) for p in parts)


class Api:
    """The API at `url` ("https://host") with `token` (None: anonymous calls only).
    timeout: seconds per request."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        if token and not _TOKEN.fullmatch(token):  # httpx's error would quote the header
            raise CliError("the API token has characters no token has (spaces, control or "
                           "non-ASCII characters; it is not shown): log in again", EXIT_AUTH)
        headers = {"User-Agent": f"gpumarket-cli/{__version__}", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def __repr__(self) -> str:
        return f"Api({self.url!r})"

    def close(self) -> None:
        self._http.close()

    def call(self, method: str, path: str, body: dict | None = None, *,
             params: dict | None = None, auth: bool = True, retry_timeout: bool = False):
        """The decoded JSON answer (None for 204). CliError as the module doc says.
        `retry_timeout`: send once more after a timeout (only for idempotent bodies)."""
        if auth and not self.token:  # is anything there? (a bare GET: the body stays here)
            self._send("GET", "/api/v1/", None, None)
            raise CliError(f"not logged in to {self.url}: run `gpumarket login --url "
                           f"{self.url}`", EXIT_AUTH)
        try:
            response = self._send(method, "/api/v1" + path, body, params)
        except CliError:
            if not retry_timeout:
                raise
            response = self._send(method, "/api/v1" + path, body, params)
        if response.status_code == 204:
            return None
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.is_success:
            if data is None:
                raise CliError(f"{method} {path}: the server answered with a body that is not "
                               "JSON (is --url the marketplace?)", EXIT_UNREACHABLE)
            return data
        line = refusal_line(response.status_code, data)
        if response.status_code == 401:
            raise CliError(f"the server refused the token ({line}): log in again with "
                           "`gpumarket login`", EXIT_AUTH)
        if response.status_code >= 500:
            raise CliError(f"the server failed ({response.status_code}: {line}); try again "
                           "later", EXIT_UNREACHABLE)
        if response.status_code == 404 and data is None:
            raise CliError(f"{method} {path}: not found on {self.url} (is the server older "
                           "than this CLI?)", EXIT_REFUSED)
        raise CliError(line, EXIT_REFUSED)

    def _send(self, method: str, path: str, body: dict | None, params: dict | None):
        """The HTTP response; CliError (exit 4) when nothing answers in time."""
        try:
            return self._http.request(method, path, json=body, params=params)
        except httpx.TimeoutException:
            raise CliError(f"{self.url} did not answer in time", EXIT_UNREACHABLE) from None
        except httpx.TransportError as exc:
            reason = str(exc) or exc.__class__.__name__
            raise CliError(f"cannot reach {self.url}: {reason}", EXIT_UNREACHABLE) from None

    def get(self, path: str, **kw):
        return self.call("GET", path, **kw)

    def post(self, path: str, body: dict | None = None, **kw):
        return self.call("POST", path, body, **kw)

    def delete(self, path: str, **kw):
        return self.call("DELETE", path, **kw)

    def results(self, path: str, *, params: dict | None = None, auth: bool = True,
                limit: int | None = 500) -> tuple[dict, list]:
        """A list endpoint's answer ({count, next, previous, results}: its first page of up
        to `limit` items; None: the endpoint's own default) and its results."""
        params = {**({"limit": limit} if limit else {}), **(params or {})}
        data = self.get(path, params=params or None, auth=auth)
        return data, list(data.get("results") or [])
