"""The runner's image cache (docs/IMAGES.md): which images it pulled, when each was last
used, a bound on their total size with least-recently-used eviction (never an image a
lease uses), what it reports in its heartbeat, and pre-pulls while idle.

Sizes are the engine's image `Size` (bytes, uncompressed, as `docker images` shows);
layers shared between images are counted in each. Only images the runner pulled itself
are evicted; images that were on the engine before (the provider's own, built locally)
are reported but never removed. The record is `<state dir>/images.json`, so a restarted
runner keeps its LRU order.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from .pull import normalize

DEFAULT_BOUND = 200 * 1024**3  # bytes: 200 GiB of pulled images
REPORT_MAX = 200  # images in one heartbeat report
REPORT_EVERY_S = 600.0  # the report is sent when it changes, and at least this often
PREFETCH_EVERY_S = 600.0  # the wanted list is asked this often
PREFETCH_RETRY_S = 3600.0  # a pre-pull that failed (or did not fit) is not tried sooner
SIZES_MAX = 1000  # sizes of evicted images remembered (the oldest forgotten first)


def parse_size(text: str) -> int:
    """"200g", "512m", "1.5t", "1073741824" → bytes (binary units: k, m, g, t). ValueError
    for anything else or a size below 0."""
    raw = str(text).strip().lower().removesuffix("b").removesuffix("i")
    units = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
    factor = units.get(raw[-1:], 1)
    number = raw[:-1] if raw[-1:] in units else raw
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a size such as 200g or 512m") from None
    if value < 0 or value != value:
        raise ValueError(f"{text!r} is not a size such as 200g or 512m")
    return int(value * factor)


class ImageCache:
    """The pulled images of one engine (`client`: docker SDK DockerClient), bounded by
    `bound` bytes. `path`: the JSON record (None: in memory only). `log`: one line per
    eviction and per refusal. Methods never raise for an engine error on one image; they
    log it and go on."""

    def __init__(self, client, path: str | Path | None, bound: int = DEFAULT_BOUND,
                 log: Callable[[str], None] = print) -> None:
        import docker

        self._errors = docker.errors
        self.client = client
        self.path = None if path is None else Path(path)
        self.bound = int(bound)
        self.log = log
        # ref → {"id": image id, "bytes": size, "used": epoch seconds (0: pre-pulled, unused)}
        self.pulled: dict[str, dict] = {}
        # ref → bytes of an image pulled once and gone since (evicted): its size is known
        self.sizes: dict[str, int] = {}
        self._load()
        self._report: list[dict] | None = None  # cached heartbeat report
        self._report_sent: list[dict] | None = None
        self._report_due = 0.0  # monotonic time the engine is read again for the report
        self._sent_at = 0.0  # monotonic time the report was last sent
        self.over_bound_logged = False

    # -- record ------------------------------------------------------------------------
    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text())
            self.pulled = {str(k): dict(v) for k, v in (data.get("pulled") or {}).items()}
            self.sizes = {str(k): int(v) for k, v in (data.get("sizes") or {}).items()}
        except (OSError, ValueError, TypeError, AttributeError):
            self.pulled, self.sizes = {}, {}  # broken: start afresh (only forgets more)

    def _save(self) -> None:
        self._report = None
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pulled": self.pulled, "sizes": self.sizes},
                                  sort_keys=True))
        os.replace(tmp, self.path)

    def _forget(self, ref: str) -> dict:
        """Drop `ref` from the record, keeping its size in `sizes` (at most SIZES_MAX)."""
        entry = self.pulled.pop(ref)
        self.sizes.pop(ref, None)
        self.sizes[ref] = int(entry.get("bytes") or 0)
        while len(self.sizes) > SIZES_MAX:
            del self.sizes[next(iter(self.sizes))]
        return entry

    def _image(self, ref: str):
        try:
            return self.client.images.get(ref)
        except self._errors.ImageNotFound:
            return None

    def present(self, ref: str) -> bool:
        """Whether `ref` is on the engine now."""
        return self._image(normalize(ref)) is not None

    def pulled_now(self, ref: str, *, prefetch: bool = False) -> None:
        """Record a finished pull of `ref` (its id and size); a pre-pull counts as never
        used, so it is the first to go when space is short."""
        ref = normalize(ref)
        image = self._image(ref)
        if image is None:
            return
        old = self.pulled.get(ref, {})
        self.pulled[ref] = {"id": image.id, "bytes": int(image.attrs.get("Size") or 0),
                            "used": old.get("used", 0.0) if prefetch else time.time()}
        self.sizes.pop(ref, None)
        self._save()

    def used(self, ref: str) -> None:
        """A lease starts with `ref`: it becomes the most recently used."""
        ref = normalize(ref)
        if ref in self.pulled:
            self.pulled[ref]["used"] = time.time()
            self._save()

    def total(self) -> int:
        """Bytes of the pulled images still on the engine."""
        return sum(int(v.get("bytes") or 0) for v in self.pulled.values())

    def fits(self, ref: str, in_use: Iterable[str]) -> bool:
        """Whether a pre-pull of `ref` would stay: its known size (an image pulled before
        and evicted) plus what eviction keeps ahead of a never-used image (the pulled
        images in `in_use` and those a lease used) is within the bound. True when its
        size is unknown (never pulled here: it is tried, and skipped if evicted at once)."""
        ref = normalize(ref)
        size = self.sizes.get(ref)
        if size is None or ref in self.pulled:
            return True
        keep = {normalize(r) for r in in_use if r}
        held = sum(int(v.get("bytes") or 0) for r, v in self.pulled.items()
                   if r in keep or (v.get("used") or 0) > 0)
        return held + size <= self.bound

    # -- eviction ------------------------------------------------------------------------
    def evict(self, in_use: Iterable[str]) -> list[str]:
        """Remove least-recently-used pulled images until their total is within the bound,
        never one in `in_use` (refs of listed leases and of this node's containers) nor one
        whose image id such a ref has. Returns the refs removed. An image the engine
        refuses to remove (a container outside the runner uses it: 409) is skipped."""
        keep = {normalize(r) for r in in_use if r}
        keep_ids = {self.pulled[r]["id"] for r in keep if r in self.pulled}
        for ref in list(self.pulled):
            if self._image(ref) is None:  # removed outside the runner
                self._forget(ref)
        removed: list[str] = []
        total = self.total()
        if total <= self.bound:
            self.over_bound_logged = False
            self._save()
            return removed
        for ref in sorted(self.pulled, key=lambda r: (self.pulled[r].get("used") or 0, r)):
            if total <= self.bound:
                break
            entry = self.pulled[ref]
            if ref in keep or entry.get("id") in keep_ids:
                continue
            try:
                self.client.images.remove(ref)
            except self._errors.APIError as exc:
                self.log(f"image cache: {ref} not evicted: {exc.explanation or exc}")
                continue
            self._forget(ref)
            total -= int(entry.get("bytes") or 0)
            removed.append(ref)
            self.log(f"image cache: evicted {ref} ({int(entry.get('bytes') or 0) >> 20} MiB, "
                     f"least recently used); {total >> 20} MiB of {self.bound >> 20} MiB held")
        if total > self.bound and not self.over_bound_logged:
            self.log(f"image cache: {total >> 20} MiB held, over the bound of "
                     f"{self.bound >> 20} MiB: every image left is in use by a lease")
            self.over_bound_logged = True
        self._save()
        return removed

    # -- the heartbeat's report ------------------------------------------------------------
    def report(self) -> list[dict]:
        """What the engine holds: [{"image": tag, "bytes": size}] for every tagged image
        (pulled or local), largest REPORT_MAX tags, sorted by tag. Read from the engine
        when the record changed or REPORT_EVERY_S passed."""
        now = time.monotonic()
        if self._report is None or now >= self._report_due:
            items = []
            try:
                listed = self.client.images.list()
            except self._errors.DockerException:
                listed = []
            for image in listed:
                for tag in image.tags or []:
                    items.append({"image": tag, "bytes": int(image.attrs.get("Size") or 0)})
            items.sort(key=lambda i: i["image"])
            self._report = items[:REPORT_MAX]
            self._report_due = now + REPORT_EVERY_S
        return self._report

    def report_due(self) -> list[dict] | None:
        """The report when it differs from the last one sent or REPORT_EVERY_S passed since,
        else None; `sent` marks it sent."""
        current = self.report()
        if current == self._report_sent and time.monotonic() < self._sent_at + REPORT_EVERY_S:
            return None
        return current

    def sent(self, report: list[dict]) -> None:
        self._report_sent, self._sent_at = report, time.monotonic()


class Prefetcher:
    """Pre-pulls while the node is idle: every PREFETCH_EVERY_S it asks the marketplace
    which images it wants on this node (`wanted()`: GET /api/v1/runner/images/, the
    templates' images and those of the node's markets' recent leases, most wanted first)
    and pulls the first one the engine lacks, one at a time (`puller`), only while no lease
    is waiting to start, and only one that fits (ImageCache.fits: an image evicted before
    is not pulled again to be evicted again). A pre-pull that fails, or that eviction
    removes at once (it did not fit), is not tried again for PREFETCH_RETRY_S."""

    def __init__(self, cache: ImageCache, puller, wanted: Callable[[], list[str]],
                 log: Callable[[str], None] = print, every_s: float = PREFETCH_EVERY_S
                 ) -> None:
        self.cache, self.puller, self.wanted_fn, self.log = cache, puller, wanted, log
        self.every_s = every_s
        self.wanted: list[str] = []
        self._next_ask = 0.0
        self._skip: dict[str, float] = {}  # ref → monotonic time it may be tried again
        self.current: str | None = None  # the pre-pull under way
        self.done: list[str] = []  # refs pre-pulled, in order (for status and tests)

    def tick(self, idle: bool, in_use: Callable[[], Iterable[str]] = tuple) -> None:
        """Finish the bookkeeping of a pre-pull that ended; when `idle` and no pull is
        under way, start the next one that fits beside the images `in_use()` (refs of the
        listed leases and this node's containers; called only when an image is weighed)."""
        now = time.monotonic()
        if self.current is not None:
            state = self.puller.state(self.current)
            if state is not None and state.phase == "pulling":
                return
            if state is None:  # a lease wanted it meanwhile and took the pull over
                self.done.append(self.current)
            elif state.phase == "done":
                self.cache.pulled_now(self.current, prefetch=True)
                self.done.append(self.current)
                self.log(f"image cache: pre-pulled {self.current} in {state.seconds():.1f} s")
            else:
                self.log(f"image cache: pre-pull of {self.current} failed: {state.error}")
                self._skip[self.current] = now + PREFETCH_RETRY_S
            if state is not None:
                self.puller.forget(self.current)
            self.current = None
        if not idle or self.puller.busy():
            return
        if now >= self._next_ask:
            self._next_ask = now + self.every_s
            with contextlib.suppress(Exception):  # an outage: ask again next time
                self.wanted = [normalize(r) for r in self.wanted_fn()]
        for ref in self.wanted:
            if self._skip.get(ref, 0.0) > now or self.cache.present(ref):
                continue
            if ref in self.cache.sizes and not self.cache.fits(ref, in_use()):
                self._skip[ref] = now + PREFETCH_RETRY_S
                self.log(f"image cache: {ref} not pre-pulled: its "
                         f"{self.cache.sizes[ref] >> 20} MiB do not fit in the bound of "
                         f"{self.cache.bound >> 20} MiB beside the images leases use")
                continue
            self.current = ref
            self.puller.ensure(ref)
            return

    def evicted(self, refs: list[str]) -> None:
        """Pre-pulled images eviction removed: they do not fit; not tried again soon."""
        for ref in refs:
            if ref in self.done:
                self._skip[ref] = time.monotonic() + PREFETCH_RETRY_S
