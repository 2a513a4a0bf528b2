"""Following a lease: `wait` (until running) and `logs --follow`.

Status changes come over the `/ws/me/` feed (docs/FEED_PROTOCOL.md: a single-use ticket
from POST /api/v1/ws-tickets/, an Origin header, `lease` messages, `resync` on a gap);
when the websocket cannot be opened or drops, GET /api/v1/leases/<id>/ every
`interval` seconds instead. The feed carries no log lines: `logs --follow` reads the tail
(GET /api/v1/leases/<id>/logs/) every `interval` seconds and prints the lines that are
new, and stops once the feed (or a poll) says the lease ended.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator

from websockets.exceptions import WebSocketException
from websockets.sync.client import connect

from .api import Api
from .config import EXIT_AUTH, EXIT_REFUSED, CliError
from .render import ENDED

SAYS = {"pending": "waiting for the provider's runner to take it",
        "starting": "the runner is starting the container"}  # other statuses say themselves


def open_feed(api: Api) -> tuple[Feed | None, str | None]:
    """(the feed, None), or (None, why) when it cannot be opened: no ticket (an older
    server), no websocket, a refused handshake. A refused token stays an error (exit 3)."""
    try:
        return Feed(api), None
    except CliError as exc:
        if exc.code == EXIT_AUTH:
            raise
        return None, str(exc)
    except (OSError, WebSocketException) as exc:
        return None, str(exc) or exc.__class__.__name__


class Feed:
    """The `/ws/me/` websocket of the API's user: `leases(lease_id)` yields the lease's
    feed payload at each change (the snapshot's first). OSError/WebSocketException when
    it cannot be opened or drops; callers fall back to polling."""

    def __init__(self, api: Api) -> None:
        ticket = api.post("/ws-tickets/")["ticket"]
        base = api.url.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
        self.ws = connect(f"{base}/ws/me/?ticket={ticket}", origin=api.url,
                          open_timeout=10, close_timeout=2,
                          user_agent_header="gpumarket-cli")
        self.seq: int | None = None

    def close(self) -> None:
        self.ws.close()

    def messages(self, timeout: float) -> Iterator[dict | None]:
        """Each message (None when `timeout` seconds pass without one); asks for a
        snapshot again on a gap or `resync_required` (FEED_PROTOCOL "Sequence numbers")."""
        while True:
            try:
                message = json.loads(self.ws.recv(timeout=timeout))
            except TimeoutError:
                yield None
                continue
            seq = message.get("seq")
            if message.get("type") == "resync_required" or (
                    message.get("type") != "snapshot" and isinstance(seq, int)
                    and self.seq is not None and seq > self.seq + 1):
                self.ws.send(json.dumps({"type": "resync"}))
                self.seq = None
                continue
            if isinstance(seq, int):
                if self.seq is not None and seq <= self.seq:
                    continue  # stale
                self.seq = seq
            yield message


def lease_in(message: dict, lease_id: int) -> dict | bool | None:
    """The lease's payload in a feed message; False when the message is a snapshot that
    does not list it (a snapshot lists leases not ended: it ended); None otherwise."""
    if message.get("type") == "snapshot":
        found = [le for le in message.get("leases") or [] if le.get("id") == lease_id]
        return found[0] if found else False
    if message.get("type") == "lease" and (message.get("lease") or {}).get("id") == lease_id:
        return message["lease"]
    return None


def progress_line(lease: dict) -> str:
    """"lease 7: starting — the runner is starting the container"; while starting with
    the runner's progress (an image pull, docs/IMAGES.md), that instead."""
    status = lease.get("status")
    if status == "starting" and lease.get("progress"):
        return f"lease {lease.get('id')}: starting — {lease['progress']}"
    cause = f" ({lease['cause']})" if lease.get("cause") else ""
    return f"lease {lease.get('id')}: {status}{cause}" + (f" — {SAYS[status]}"
                                                          if status in SAYS else "")


FAILOVER_WAIT_S = 10.0  # how long `wait` lets a failed lease's failover settle


def settled_failover(api: Api, lease: dict, deadline: float) -> dict:
    """A failed lease once its failover left "pending" (polled at most FAILOVER_WAIT_S,
    never past `deadline`), so the buyer is told where the chain went."""
    until = min(deadline, time.monotonic() + FAILOVER_WAIT_S)
    while lease.get("failover_state") == "pending" and time.monotonic() < until:
        time.sleep(0.5)
        lease = api.get(f"/leases/{int(lease['id'])}/")
    return lease


def chain_words(lease: dict) -> str:
    """"; continued as lease 42 on node B …" / "; … continues as bid 9, resting at $X…":
    what became of a failed lease (its line of the API's chain story), "" for none."""
    head = f"lease {lease.get('id')} failed "
    for line in (lease.get("chain") or {}).get("story") or ():
        told = _TOLD.search(line) if line.startswith(head) else None
        if told:
            return "; " + line[told.end():]
    return ""


_TOLD = re.compile(r"\) at (?:\d{2}:\d{2}:\d{2}|\?); ")  # chains.story: "(cause) at T; …"


def wait_running(api: Api, lease_id: int, *, timeout: float, interval: float,
                 say: Callable[[str], None]) -> dict:
    """The lease (GET answer) once it is running; `say` gets a line at each status seen.
    CliError (exit 1) when it ended instead or `timeout` seconds passed."""
    deadline = time.monotonic() + timeout
    seen: list[str] = []

    said: list[str] = []

    def note(lease: dict) -> dict | None:
        status = lease.get("status")
        if not seen or seen[-1] != status:
            seen.append(status)
        line = progress_line(lease)  # a new status, or new progress while starting
        if not said or said[-1] != line:
            said.append(line)
            say(line)
        if status in ENDED:
            lease = settled_failover(api, lease, deadline)
            cause = f": {lease['cause']}" if lease.get("cause") else ""
            cause += chain_words(lease)
            raise CliError(f"lease {lease_id} has ended ({status}{cause})"
                           if lease.get("started_at") else
                           f"lease {lease_id} {status} before it ran{cause}", EXIT_REFUSED)
        return lease if status == "running" else None

    path = f"/leases/{int(lease_id)}/"
    if done := note(api.get(path)):
        return done
    feed, why = open_feed(api)
    if feed is None:
        say(f"(the live feed is unavailable: {why}; polling every {interval:g} s)")
    else:
        try:
            for message in feed.messages(timeout=max(0.1, deadline - time.monotonic())):
                if message is None or time.monotonic() >= deadline:
                    break
                found = lease_in(message, lease_id)
                if found is False or (found and found.get("status") in ("running", *ENDED)):
                    if done := note(api.get(path)):  # the full answer (`connect`)
                        return done
                elif found:
                    note(found)
        except (OSError, WebSocketException) as exc:
            say(f"(the live feed dropped: {exc}; polling every {interval:g} s)")
        finally:
            feed.close()
    while time.monotonic() < deadline:
        if done := note(api.get(path)):
            return done
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
    raise CliError(f"lease {lease_id} is still {seen[-1] if seen else '?'} after "
                   f"{timeout:g} s", EXIT_REFUSED)


def new_lines(old: str, new: str) -> list[str]:
    """The lines of the tail `new` that follow what `old` showed: the runner sends its
    latest tail each time (replacing the previous one), so the longest end of `old`
    that begins `new` is skipped."""
    before, after = old.splitlines(), new.splitlines()
    for k in range(min(len(before), len(after)), 0, -1):
        if before[-k:] == after[:k]:
            return after[k:]
    return after


def follow_logs(api: Api, lease_id: int, *, interval: float,
                out: Callable[[list[str], dict], None]) -> dict:
    """Print the log tail, then its new lines (`out(lines, body)`) until the lease ends;
    returns the lease. Ctrl-C ends it too (KeyboardInterrupt goes to the caller)."""
    logs, path = f"/leases/{int(lease_id)}/logs/", f"/leases/{int(lease_id)}/"
    shown = ""

    def read() -> None:
        nonlocal shown
        body = api.get(logs)
        tail = body.get("tail") or ""
        lines = new_lines(shown, tail)
        if lines:
            out(lines, body)
        shown = tail

    read()
    lease = api.get(path)
    feed = open_feed(api)[0] if lease.get("status") not in ENDED else None
    try:
        while lease.get("status") not in ENDED:
            if feed is not None:
                try:
                    next_poll = time.monotonic() + interval
                    for message in feed.messages(timeout=interval):
                        found = None if message is None else lease_in(message, lease_id)
                        if found is False:
                            lease = api.get(path)
                        elif found:
                            lease = found
                        if lease.get("status") in ENDED or time.monotonic() >= next_poll:
                            break
                except (OSError, WebSocketException):
                    feed.close()
                    feed = None
            else:
                time.sleep(interval)
                lease = api.get(path)
            read()
        read()
        return lease
    finally:
        if feed is not None:
            feed.close()
