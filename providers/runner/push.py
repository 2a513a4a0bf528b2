"""The runner's websocket to the marketplace (`/ws/runner/`, docs/RUNNER_PROTOCOL.md):
lease notices pushed to it, so a new lease starts without waiting for the next poll.

A background thread keeps one connection (the `websockets` library's sync client) with
`Authorization: Bearer <token>` and `Origin: <marketplace URL>`. Every `hello` (on
connect) and `leases_changed` notice calls `on_notice(seq)`; the agent then fetches the
lease list at once. When the connection fails or drops, the thread reconnects after
1 s, doubling up to `max_backoff` (30 s), and starts again at 1 s once a connection has
been up. Meanwhile the agent polls over HTTP at its normal interval (`connected` is False).
Each change of state is logged once: connected, down (with the reason), refused token.
`hello` says whether the marketplace's notices are complete or partial (`"notices"`; a
marketplace without a shared channel layer pushes only its web process's own changes):
with partial notices `partial` is True and the agent polls at its normal interval as well,
logged once.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

from . import __version__

CLOSE_UNAUTHENTICATED = 4401
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0


def websocket_url(base_url: str) -> str:
    """'https://host[:port][/prefix]' → 'wss://host[:port][/prefix]/ws/runner/' (http → ws)."""
    parts = urlsplit(base_url.rstrip("/"))
    scheme = {"https": "wss", "http": "ws"}.get(parts.scheme)
    if scheme is None:
        raise ValueError(f"not an http(s) URL: {base_url!r}")
    return f"{scheme}://{parts.netloc}{parts.path}/ws/runner/"


def _origin(base_url: str) -> str:
    parts = urlsplit(base_url)
    return f"{parts.scheme}://{parts.netloc}"


def _reason(exc: BaseException) -> str:
    """A short, token-free description of why a connection failed or ended."""
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    if isinstance(exc, InvalidStatus):
        return f"handshake answered HTTP {exc.response.status_code}"
    if isinstance(exc, ConnectionClosed):
        frame = exc.rcvd
        if frame is None:
            return "connection lost"
        why = f", {frame.reason}" if frame.reason else ""
        return f"closed by the marketplace (code {frame.code}{why})"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError):
        return exc.strerror or exc.__class__.__name__
    return f"{exc.__class__.__name__}: {exc}"[:200]


class PushListener:
    """Keeps the websocket open in a daemon thread. url: the marketplace base URL (as for
    MarketplaceClient); token: the runner token (never logged); log: one line per state
    change; max_backoff: seconds, the longest wait between reconnection attempts."""

    def __init__(self, url: str, token: str, *, log: Callable[[str], None],
                 poll_interval: float = 2.0, max_backoff: float = MAX_BACKOFF_S,
                 open_timeout: float = 10.0) -> None:
        self.url = websocket_url(url)
        self._origin = _origin(url)
        self._headers = {"Authorization": f"Bearer {token}"}
        self.log = log
        self.poll_interval = poll_interval
        self.max_backoff = max_backoff
        self.open_timeout = open_timeout
        self.connected = False
        self.partial = False  # the marketplace said its notices are partial (hello)
        self._told_partial = False  # "partial" was logged once
        self.last_seq: int | None = None
        self.notices = 0  # notices received (hello included)
        self._state = "starting"  # "connected" | "down" | "refused": what was last logged
        self._stop = threading.Event()
        self._ws = None
        self._on_notice: Callable[[int | None], None] = lambda _seq: None
        self.thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"PushListener({self.url!r})"

    def start(self, on_notice: Callable[[int | None], None]) -> None:
        """Start the thread; `on_notice(seq)` is called from it for every notice."""
        self._on_notice = on_notice
        self.thread = threading.Thread(target=self._run, name="runner-push", daemon=True)
        self.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Close the connection and end the thread."""
        self._stop.set()
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(Exception):  # already closing: nothing to report
                ws.close()
        if self.thread is not None:
            self.thread.join(timeout)

    # -- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        backoff = FIRST_BACKOFF_S
        while not self._stop.is_set():
            try:
                self._session()
                reason = "closed by the marketplace"
            except Exception as exc:  # every failure is a reason to fall back and retry
                reason = _reason(exc)
                refused = getattr(getattr(exc, "rcvd", None), "code", None)
                if refused == CLOSE_UNAUTHENTICATED:
                    self._set_state("refused", "push: the marketplace refused the runner "
                                    "token on the websocket (4401); polling every "
                                    f"{self.poll_interval:g} s")
            was_connected = self.connected
            self.connected = False
            self._ws = None
            if self._stop.is_set():
                break
            if was_connected:
                backoff = FIRST_BACKOFF_S
            if self._state != "refused":
                self._set_state("down", f"push: websocket {self.url} down ({reason}); "
                                f"polling every {self.poll_interval:g} s, reconnecting with "
                                f"back-off up to {self.max_backoff:g} s")
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.max_backoff)

    def _session(self) -> None:
        from websockets.sync.client import connect

        ws = connect(self.url, additional_headers=self._headers, origin=self._origin,
                     user_agent_header=f"gpumarket-runner/{__version__}",
                     open_timeout=self.open_timeout, ping_interval=20, ping_timeout=20,
                     close_timeout=2, max_size=2**16)
        self._ws = ws
        with ws:
            for message in ws:
                if self._stop.is_set():
                    return
                try:
                    data = json.loads(message)
                except (TypeError, ValueError):
                    continue
                if not isinstance(data, dict) or data.get("type") not in (
                        "hello", "leases_changed"):
                    continue
                seq = data.get("seq") if isinstance(data.get("seq"), int) else None
                if data["type"] == "hello":
                    self._hello(data)
                self.last_seq = seq
                self.notices += 1
                self._on_notice(seq)

    def _hello(self, data: dict) -> None:
        """The connection is up; learn whether the marketplace pushes every change
        (`notices`: "complete", or absent from an older marketplace) or only some
        ("partial": the agent keeps polling too). Each is logged once, and again only
        when it changes."""
        partial = data.get("notices") == "partial"
        changed = partial != self.partial or not self._told_partial
        self.partial = partial  # before `connected`: the agent never sees a wrong pair
        self.connected = True
        self._set_state("connected", f"push: websocket {self.url} connected; " + (
            "some lease changes arrive at once" if partial else
            "leases arrive as soon as they change"))
        if changed and (partial or self._told_partial):
            self.log(f"push: the marketplace's notices are partial (its channel layer is "
                     f"in-memory: changes made by its worker process, such as an auction's "
                     f"lease or a preemption, are not pushed); also polling every "
                     f"{self.poll_interval:g} s" if partial else
                     "push: the marketplace's notices are complete now; polling only while "
                     "the websocket is down")
        self._told_partial = self._told_partial or partial

    def _set_state(self, state: str, line: str) -> None:
        if state != self._state:
            self._state = state
            self.log(line)
