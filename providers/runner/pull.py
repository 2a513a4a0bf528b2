"""Image pulls in the background, with progress (docs/IMAGES.md).

A pull of a multi-GB image takes minutes; the runner's loop must keep heartbeating and
serving the other leases meanwhile, so each image is pulled in a thread of its own
(`Puller.ensure`), on a Docker client of its own, and the loop reads its `PullState`
each tick: bytes done and total (bytes of the layers the registry announced; layers
already present count as done), the phase, the error. One pull per image at a time; a
second lease of the same image waits on the same pull. A reference whose registry is
`localhost` or a private/loopback IP literal (registry_host.py) fails without a pull
unless `allow_private_registry` (the runner's --allow-private-registry).

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


def mib(n: int) -> str:
    return f"{n / 1048576:.0f} MiB"


@dataclass
class PullState:
    """One image's pull: phase "pulling" | "done" | "failed"; done/total bytes of its
    layers (total 0 until the registry announced them); layers seen and complete; error
    (the engine's word) when failed; started/ended (monotonic seconds)."""

    ref: str
    phase: str = "pulling"
    done: int = 0
    total: int = 0
    layers: int = 0
    complete: int = 0
    error: str = ""
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None

    def text(self) -> str:
        """For the buyer: "pulling image R: 312 MiB of 1024 MiB (30 %), 1 of 4 layers"."""
        if self.phase == "failed":
            return f"image {self.ref} could not be pulled: {self.error}"
        if self.phase == "done":
            return f"image {self.ref} pulled in {self.seconds():.1f} s"
        if not self.total:
            return f"pulling image {self.ref}: asking the registry"
        pct = 100 * self.done // self.total
        return (f"pulling image {self.ref}: {mib(self.done)} of {mib(self.total)} ({pct} %), "
                f"{self.complete} of {self.layers} layers")

    def seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.started


class _Layers:
    """Per-layer byte counts from the engine's pull stream (JSON messages: status,
    id, progressDetail {current, total})."""

    def __init__(self) -> None:
        self.total: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.finished: set[str] = set()

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
            self.done[layer] = min(int(detail.get("current") or 0), self.total[layer])
        elif status in ("Download complete", "Verifying Checksum", "Extracting"):
            self.done[layer] = self.total[layer]
        elif status in ("Pull complete", "Already exists"):
            self.done[layer] = self.total[layer]
            self.finished.add(layer)


class Puller:
    """Background pulls on the engine that `docker.from_env()` reaches (the runtime's),
    each thread on a client of its own. `pull_fn(ref, on_message)` may replace the Docker
    call (it must call on_message with each stream message and raise on failure). The
    caller reads the states from one thread (the runner's loop); a pull's thread only
    writes its own state, then calls `notify()` (the agent sets it: its loop ticks at once
    instead of at its next poll). `allow_private_registry`: pull from registries at
    localhost or private/loopback addresses too (otherwise such a pull fails at once)."""

    def __init__(self, *, timeout: float = 600.0, pull_fn=None,
                 allow_private_registry: bool = False) -> None:
        self.notify = None
        self.timeout = timeout
        self.allow_private_registry = allow_private_registry
        self.pulls: dict[str, PullState] = {}
        self._lock = threading.Lock()
        self._pull_fn = pull_fn or self._docker_pull

    def _docker_pull(self, ref: str, on_message) -> None:
        import docker

        api = docker.from_env(timeout=self.timeout).api
        try:
            name, tag = split_ref(ref)
            for msg in api.pull(name, tag=tag, stream=True, decode=True):
                if msg.get("error"):
                    raise RuntimeError(str(msg["error"]))
                on_message(msg)
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

    def _run(self, state: PullState) -> None:
        layers = _Layers()

        def on_message(msg: dict) -> None:
            layers.feed(msg)
            state.total = sum(layers.total.values())
            state.done = sum(layers.done.values())
            state.layers = len(layers.total)
            state.complete = len(layers.finished)

        private = None if self.allow_private_registry else private_registry_problem(state.ref)
        try:
            if private:
                raise RuntimeError(f"{private}: the runner pulls from such a registry only "
                                   "with --allow-private-registry")
            self._pull_fn(state.ref, on_message)
        except Exception as exc:  # APIError (404 manifest unknown, 500), connection errors
            explanation = getattr(exc, "explanation", None)
            state.error = (str(explanation or exc) or exc.__class__.__name__)[:200]
            state.phase = "failed"
        else:
            state.done = state.total
            state.phase = "done"
        state.ended = time.monotonic()
        if self.notify is not None:
            self.notify()
