"""HTTP client for the runner endpoints of the marketplace (docs/RUNNER_PROTOCOL.md, v1).

Every call sends `Authorization: Bearer <runner token>`; the token is never logged, printed
or shown in repr(). Errors:
- Unauthorized (401): the token is unknown, rotated or revoked; re-register the node.
- Conflict (409): an illegal move; the marketplace already knows.
- Unreachable: connection refused, DNS failure, timeout; transient.
- MarketplaceError(status, detail): any other non-2xx answer or a body that is not JSON.
"""

from __future__ import annotations

import httpx

from . import __version__
from .lease import RunnerLease


class MarketplaceError(RuntimeError):
    """The marketplace answered with an error. status: HTTP status (None if unreachable);
    detail: its `detail` field, or the body text."""

    def __init__(self, status: int | None, detail: str) -> None:
        self.status, self.detail = status, detail
        super().__init__(f"marketplace error {status}: {detail}" if status else detail)

    @property
    def transient(self) -> bool:
        """True for errors worth retrying later (unreachable, 5xx, 429)."""
        return self.status is None or self.status >= 500 or self.status == 429


class Unauthorized(MarketplaceError):
    """401: the marketplace refused the runner token."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(401, detail)
        self.args = ("the marketplace refused the runner token (401): re-register the node "
                     "with its current token (it may have been rotated)",)

    def __str__(self) -> str:
        return self.args[0]


class Conflict(MarketplaceError):
    """409: the move is illegal now; the runner treats it as "already known"."""


class Unreachable(MarketplaceError):
    """No answer: connection refused, DNS failure or timeout."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(None, f"the marketplace at {url} does not answer ({reason})")


class MarketplaceClient:
    """The runner endpoints. url: the marketplace base URL ("https://host");
    timeout: seconds per request. transport: an httpx transport (tests only)."""

    def __init__(self, url: str, token: str, *, timeout: float = 10.0, transport=None) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}",
                     "User-Agent": f"gpumarket-runner/{__version__}"},
            timeout=timeout,
            transport=transport,
        )
        self.last_date: str | None = None  # the Date header of the last answer

    def __repr__(self) -> str:
        return f"MarketplaceClient({self.url!r})"

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        try:
            response = self._http.request(method, path, json=body)
            self.last_date = response.headers.get("date")
        except httpx.TimeoutException:
            raise Unreachable(self.url, "timed out") from None
        except httpx.TransportError as exc:
            raise Unreachable(self.url, str(exc) or exc.__class__.__name__) from None
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.is_success:
            if not isinstance(data, dict):
                raise MarketplaceError(response.status_code,
                                       f"{method} {path} answered with a body that is not JSON")
            return data
        detail = data.get("detail") if isinstance(data, dict) else None
        detail = str(detail if detail is not None else (data or response.text[:200]))
        if response.status_code == 401:
            raise Unauthorized(detail)
        if response.status_code == 409:
            raise Conflict(409, detail)
        raise MarketplaceError(response.status_code, f"{method} {path}: {detail}")

    def post_inventory(self, inventory: dict) -> dict:
        """POST /api/v1/runner/inventory/ → {"node": {"id", "name", "gpus": [...]}}."""
        return self._call("POST", "/api/v1/runner/inventory/", inventory)

    def heartbeat(self, runtime: str, gpus: list[dict], findings: list[dict] | None = None,
                  telemetry: list[dict] | None = None, images: list[dict] | None = None
                  ) -> dict:
        """POST /api/v1/runner/heartbeat/ → {"server_time": ISO 8601 UTC, and
        "telemetry_errors" when readings were refused}. `findings` (health findings, not
        ok ones), `telemetry` (telemetry.lease_telemetry) and `images` (what the image
        cache holds, [{"image", "bytes"}]: images.ImageCache.report) are sent when given."""
        body = {"runtime": runtime, "gpus": gpus}
        if findings is not None:
            body["findings"] = findings
        if telemetry:
            body["telemetry"] = telemetry
        if images is not None:
            body["images"] = images
        return self._call("POST", "/api/v1/runner/heartbeat/", body)

    def images_wanted(self) -> list[str]:
        """GET /api/v1/runner/images/ → the image refs the marketplace wants pre-pulled on
        this node, most wanted first (docs/IMAGES.md)."""
        data = self._call("GET", "/api/v1/runner/images/")
        return [str(item["image"]) for item in data.get("images") or []
                if isinstance(item, dict) and item.get("image")]

    def leases(self) -> list[RunnerLease]:
        """GET /api/v1/runner/leases/ → the node's pending/starting/running leases, each
        parsed once (RunnerLease.parse: KeyError/ValueError for an item without a usable
        id, as the runner always failed on one)."""
        data = self._call("GET", "/api/v1/runner/leases/")
        leases = data.get("leases")
        if not isinstance(leases, list):
            raise MarketplaceError(200, "GET /api/v1/runner/leases/ answered without 'leases'")
        return [RunnerLease.parse(item) for item in leases]

    def post_event(self, lease_id: int, status: str, **fields) -> dict:
        """POST /api/v1/runner/leases/<id>/events/ with status and any of container_id,
        cause, usage_seconds → the lease. Raises Conflict (409) for an illegal move."""
        body = {"status": status, **{k: v for k, v in fields.items() if v is not None}}
        return self._call("POST", f"/api/v1/runner/leases/{int(lease_id)}/events/", body)

    def post_logs(self, lease_id: int, tail: str) -> dict:
        """POST /api/v1/runner/leases/<id>/logs/ with the container's last lines (at most
        64 KiB of UTF-8; the caller trims) → {"lease", "tail", "updated_at"}."""
        return self._call("POST", f"/api/v1/runner/leases/{int(lease_id)}/logs/",
                          {"tail": tail})

    def post_checkpoint(self, lease_id: int, report: dict) -> dict:
        """POST /api/v1/runner/leases/<id>/checkpoints/ with one checkpoint report
        (checkpoint.py: status, reason, at, bytes, files, seconds, key, message)."""
        return self._call("POST", f"/api/v1/runner/leases/{int(lease_id)}/checkpoints/",
                          report)

    def post_benchmarks(self, body: dict) -> dict:
        """POST /api/v1/runner/benchmarks/ with {runner_version, backend, results: [...]}
        (benchmark.report_body) → {"results": [{"id", "uuid", "measured_at", "correct"}]}.
        A 400 names the refused item (e.g. `results[0].uuid`)."""
        return self._call("POST", "/api/v1/runner/benchmarks/", body)
