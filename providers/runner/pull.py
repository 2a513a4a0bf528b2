"""Image pulls in the background, with progress (docs/IMAGES.md).

A pull of a multi-GB image takes minutes; the runner's loop must keep heartbeating and
serving the other leases meanwhile, so each image is pulled in a thread of its own
(`Puller.ensure`), on a Docker client of its own, and the loop reads its `PullState`
each tick: bytes done and total (bytes of the layers the registry announced; layers
already present count as done), the phase, the error. One pull per image at a time; a
second lease of the same image waits on the same pull. A reference whose registry is
`localhost` or a private/loopback IP literal (registry_host.py) fails without a pull
unless `allow_private_registry` (the runner's --allow-private-registry). A pull that makes
no progress for `stall_timeout` seconds, or runs longer than `max_seconds`, is aborted and
fails (docs/IMAGES.md, "Stalled pulls").

Units: bytes (int), seconds (float, time.monotonic()).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from .registry_host import private_registry_problem


def split_ref(ref: str) -> tuple[str, str | None]:
    """`name[:tag][@digest]` → (repository, tag or digest) as the Docker API's pull takes
    them: "127.0.0.1:5000/a/b:1" → ("127.0.0.1:5000/a/b", "1"); "busybox" → ("busybox",
    "latest"); "a@sha256:…" → ("a", "sha256:…")."""
    if "@" in ref:
        name, digest = ref.split("@", 1)
        return name, digest
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    if colon > slash:
        return ref[:colon], ref[colon + 1:]
    return ref, "latest"


def normalize(ref: str) -> str:
    """The reference as the engine tags it: a missing tag is `latest` ("busybox" →
    "busybox:latest"), Docker Hub's `docker.io/library/` prefix goes; digests and tags
    are kept. The marketplace compares a bid's image with a node's report in this form."""
    name, tag = split_ref(ref.strip())
    for hub in ("docker.io/", "index.docker.io/"):  # Docker Hub's names as the engine tags
        if name.startswith(hub):
            name = name[len(hub):]
            name = name[len("library/"):] if name.startswith("library/") else name
    return f"{name}@{tag}" if tag and tag.startswith("sha256:") else f"{name}:{tag}"


STALL_TIMEOUT_S = 300.0  # default --pull-stall-timeout: seconds without progress
MAX_PULL_S = 6 * 3600.0  # default --pull-timeout: a pull's whole duration
CONNECT_TIMEOUT_S = 30.0  # seconds to reach the engine's socket


class PullAborted(Exception):
    """A pull the runner gave up: the message is the buyer's cause after the prefix."""


def mib(n: int) -> str:
    return f"{n / 1048576:.0f} MiB"


@dataclass
class PullState:
    """One image's pull: phase "pulling" | "done" | "failed"; done/total bytes of its
    layers to download (total 0 until the registry announced them; never decreasing
    within one pull); `sized`: every announced layer's size is known; layers seen,
    `downloaded` (downloads over) and `complete` (extracted or already present); error
    (the engine's word, or why the runner aborted) when failed; started/ended/progressed
    (monotonic seconds; progressed: the last time a byte or a layer moved); `resumed`: a
    previous runner process began this image's pull for a lease (the engine dropped its
    partial downloads, so the bytes restart: the text says "again")."""

    ref: str
    phase: str = "pulling"
    done: int = 0
    total: int = 0
    sized: bool = False
    layers: int = 0
    downloaded: int = 0
    complete: int = 0
    error: str = ""
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    progressed: float = field(default_factory=time.monotonic)
    resumed: bool = False

    def text(self) -> str:
        """For the buyer: "pulling image R: 312 MiB of 1024 MiB (30 %), 1 of 4 layers";
        "… 177 MiB of at least 301 MiB, 0 of 4 layers" while some layer's size is unknown;
        "… 1024 MiB downloaded, extracting layers (2 of 4)" once every download is over."""
        if self.phase == "failed":
            return f"image {self.ref} could not be pulled: {self.error}"
        if self.phase == "done":
            return f"image {self.ref} pulled in {self.seconds():.1f} s"
        head = (f"pulling image {self.ref} again (the runner restarted)" if self.resumed
                else f"pulling image {self.ref}")
        if not self.layers:
            return f"{head}: asking the registry"
        if self.downloaded >= self.layers:
            if self.complete >= self.layers:
                return (f"{head}: {mib(self.total)} downloaded, {self.layers} of "
                        f"{self.layers} layers in place")
            return (f"{head}: {mib(self.total)} downloaded, extracting layers "
                    f"({self.complete + 1} of {self.layers})")
        if not self.sized:
            return (f"{head}: {mib(self.done)} of at least {mib(self.total)}, "
                    f"{self.complete} of {self.layers} layers")
        pct = 100 * self.done // self.total if self.total else 100
        return (f"{head}: {mib(self.done)} of {mib(self.total)} ({pct} %), "
                f"{self.complete} of {self.layers} layers")

    def seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.started


class _Layers:
    """Per-layer byte counts from the engine's pull stream (JSON messages: status,
    id, progressDetail {current, total})."""

    def __init__(self) -> None:
        self.total: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.sized: set[str] = set()  # layers whose size is known (or need no download)
        self.downloaded: set[str] = set()
        self.finished: set[str] = set()
        self.extracted: dict[str, int] = {}  # layer → bytes extracted (progress too)

    def key(self) -> tuple:
        """What moves when the pull progresses (the stall watch compares it)."""
        return (sum(self.done.values()), sum(self.extracted.values()), len(self.sized),
                len(self.downloaded), len(self.finished))

    def feed(self, msg: dict) -> None:
        layer = msg.get("id")
        status = str(msg.get("status") or "")
        if not layer or status.startswith(("Pulling from", "Digest", "Status")):
            return
        detail = msg.get("progressDetail") or {}
        self.total.setdefault(layer, 0)
        self.done.setdefault(layer, 0)
        if status == "Downloading" and detail.get("total"):
            self.total[layer] = int(detail["total"])
            self.sized.add(layer)
            self.done[layer] = min(int(detail.get("current") or 0), self.total[layer])
        elif status in ("Download complete", "Verifying Checksum", "Extracting"):
            self.done[layer] = self.total[layer]
            self.sized.add(layer)
            self.downloaded.add(layer)
            if status == "Extracting":
                self.extracted[layer] = int(detail.get("current") or 0)
        elif status in ("Pull complete", "Already exists"):
            self.done[layer] = self.total[layer]
            self.sized.add(layer)
            self.downloaded.add(layer)
            self.finished.add(layer)


class Puller:
    """Background pulls on the engine that `docker.from_env()` reaches (the runtime's),
    each thread on a client of its own. `pull_fn(ref, on_message)` may replace the Docker
    call (it must call on_message with each stream message and raise on failure). The
    caller reads the states from one thread (the runner's loop); a pull's thread only
    writes its own state, then calls `notify()` (the agent sets it: its loop ticks at once
    instead of at its next poll). `allow_private_registry`: pull from registries at
    localhost or private/loopback addresses too (otherwise such a pull fails at once).
    `stall_timeout`: seconds without progress before a pull is aborted; `max_seconds`: the
    longest a pull may take (both > 0)."""

    def __init__(self, *, stall_timeout: float = STALL_TIMEOUT_S,
                 max_seconds: float = MAX_PULL_S, pull_fn=None,
                 allow_private_registry: bool = False) -> None:
        self.notify = None
        self.stall_timeout = stall_timeout
        self.max_seconds = max_seconds
        self.allow_private_registry = allow_private_registry
        self.pulls: dict[str, PullState] = {}
        self._lock = threading.Lock()
        self._pull_fn = pull_fn or self.docker_pull

    def docker_pull(self, ref: str, on_message) -> None:
        """The engine's pull of `ref`, each stream message to `on_message`. The engine's
        stream is read with a timeout of `stall_timeout` (docker-py's own pull reads with
        none), so a registry that stops sending ends the read; dropping the connection
        cancels the engine's pull. RuntimeError with the engine's word on its error."""
        import docker

        api = docker.from_env().api
        try:
            name, tag = split_ref(ref)
            response = api._post(api._url("/images/create"),
                                 params={"fromImage": name, "tag": tag}, stream=True,
                                 timeout=(CONNECT_TIMEOUT_S, self.stall_timeout))
            api._raise_for_status(response)
            try:
                for msg in api._stream_helper(response, decode=True):
                    if msg.get("error"):
                        raise RuntimeError(str(msg["error"]))
                    on_message(msg)
            finally:
                response.close()
        finally:
            api.close()

    def ensure(self, ref: str) -> PullState:
        """The pull of `ref`, started now in a thread unless one is under way (or done:
        a finished state stays until `forget`)."""
        with self._lock:
            state = self.pulls.get(ref)
            if state is not None:
                return state
            state = self.pulls[ref] = PullState(ref)
        threading.Thread(target=self._run, args=(state,), name=f"pull {ref}",
                         daemon=True).start()
        return state

    def state(self, ref: str) -> PullState | None:
        return self.pulls.get(ref)

    def busy(self) -> bool:
        """True while any pull is under way."""
        return any(s.phase == "pulling" for s in list(self.pulls.values()))

    def forget(self, ref: str) -> None:
        """Drop an ended pull's state (a failed pull is tried again at the next ensure)."""
        with self._lock:
            state = self.pulls.get(ref)
            if state is not None and state.phase != "pulling":
                del self.pulls[ref]

    def check(self, state: PullState, now: float | None = None) -> None:
        """PullAborted when `state` made no progress for stall_timeout seconds or ran
        longer than max_seconds."""
        now = time.monotonic() if now is None else now
        if now - state.progressed >= self.stall_timeout:
            raise PullAborted(f"no progress for {now - state.progressed:.0f} s (the "
                              "registry stalled)")
        if now - state.started >= self.max_seconds:
            raise PullAborted(f"not done after {now - state.started:.0f} s (the bound is "
                              f"{self.max_seconds:.0f} s)")

    def _run(self, state: PullState) -> None:
        layers = _Layers()
        moved = [layers.key()]

        def on_message(msg: dict) -> None:
            layers.feed(msg)
            key = layers.key()
            if key != moved[0]:
                moved[0], state.progressed = key, time.monotonic()
            state.total = max(state.total, sum(layers.total.values()))
            state.done = min(max(state.done, sum(layers.done.values())), state.total)
            state.layers = len(layers.total)
            state.sized = len(layers.sized) == state.layers
            state.downloaded = len(layers.downloaded)
            state.complete = len(layers.finished)
            self.check(state)  # the engine's messages without progress ("Waiting", retries)

        private = None if self.allow_private_registry else private_registry_problem(state.ref)
        try:
            if private:
                raise RuntimeError(f"{private}: the runner pulls from such a registry only "
                                   "with --allow-private-registry")
            self._pull_fn(state.ref, on_message)
        except Exception as exc:  # APIError (404 manifest unknown, 500), connection errors
            try:  # a read that timed out, or any error after a stall: the stall is the cause
                self.check(state)
                explanation = getattr(exc, "explanation", None)
                state.error = (str(explanation or exc) or exc.__class__.__name__)[:200]
            except PullAborted as aborted:
                state.error = str(aborted)
            state.phase = "failed"
        else:
            state.done = state.total
            state.phase = "done"
        state.ended = time.monotonic()
        if self.notify is not None:
            self.notify()
