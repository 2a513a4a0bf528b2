"""A lease's checkpoints on the runner's side (issue 15; docs/CHECKPOINTS.md).

`CheckpointStore` (one boto3 S3 client per lease, from the payload's credentials):
- `upload(src, lease_id)` puts the regular files of `src` (the bid's `path`, a directory
  or a file in the workspace) under `<bucket>/<prefix><stamp>-lease<id>/files/…`, then,
  LAST, `<…>/manifest.json` {version, lease, created_at, path, kind, bytes, files: [{path,
  bytes, sha256}]}. An upload cut short has no manifest and is never taken.
- `restore(dest)` takes the newest manifest under the prefix (stamps sort by time),
  downloads its files into a fresh directory, checks every size and sha256, and only then
  puts it in place at `dest`; a damaged one is skipped for the next older.

`CheckpointSync` is what the agent calls: `remember(lease)` on each listing, `restore(lease)`
before the workload starts, `upload(lease, "notice", delay_s=NOTICE_SETTLE_S)` (once the
notice is delivered, in the background),
`finish(lease_id, reason)` after the workload was stopped (upload, then remove the
workspace), `over_bound(lease)` for the size bound. Each transfer is reported to the
marketplace (POST /api/v1/runner/leases/<id>/checkpoints/) and logged, never a credential.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from .lease import RunnerLease
from .logtail import LINE_PART_MIN, redact
from .workspace import CHECK_INTERVAL_S, Workspaces, regular_files

TIMEOUT_S = 30
DEFAULT_PATH = "/workspace/checkpoint"  # the bid's default (marketplace/checkpoints.py)
MANIFEST = "manifest.json"
NOTICE_SETTLE_S = 5.0  # after a notice, the workload's time to write its checkpoint
# the stop sequence's reasons (notice.py: "stop", "end", "health") as reports name them
REPORTED_AS = {"health": "failure"}


class CheckpointError(Exception):
    """A transfer that failed; its message names no credential."""


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return _digest(f)


def _digest(f) -> str:
    digest = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 20), b""):
        digest.update(chunk)
    f.seek(0)
    return digest.hexdigest()


def _open_inside(path: Path, top: Path):
    """`path` opened for reading, only if it is a regular file whose real location is under
    `top`: a running workload may swap a file or a directory for a symlink at any moment,
    so the check is made on the open descriptor (O_NOFOLLOW, then /proc/self/fd). None
    otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    f = os.fdopen(fd, "rb")
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
        inside = real.startswith(os.path.realpath(top) + os.sep)
        if inside and stat.S_ISREG(os.fstat(fd).st_mode):
            return f
    except OSError:
        pass
    f.close()
    return None


def _safe_rel(rel: str) -> str:
    """A manifest's file path, refused when it could leave the restore directory (the
    bucket is the buyer's: never trusted)."""
    p = PurePosixPath(rel)
    if not rel or p.is_absolute() or ".." in p.parts or "\x00" in rel:
        raise CheckpointError(f"the manifest names an unsafe path {rel[:80]!r}")
    return p.as_posix()


class CheckpointStore:
    """The lease's bucket: cfg is the payload's `checkpoint` object."""

    def __init__(self, cfg: dict, *, timeout: float = TIMEOUT_S) -> None:
        import boto3
        from botocore.config import Config

        self.bucket, self.prefix = cfg["bucket"], cfg["prefix"]
        self.max_bytes = int(cfg["max_bytes"])
        self.s3 = boto3.client(
            "s3", endpoint_url=cfg.get("endpoint_url") or None,
            region_name=cfg.get("region") or "us-east-1",
            aws_access_key_id=cfg["access_key_id"],
            aws_secret_access_key=cfg["secret_access_key"],
            config=Config(connect_timeout=timeout, read_timeout=timeout,
                          retries={"max_attempts": 2, "mode": "standard"},
                          s3={"addressing_style": "path"}))

    def upload(self, src: Path, lease_id: int, container_path: str,
               within: Path | None = None) -> dict:
        """Upload `src`, only files really under `within` (the lease's workspace; default
        `src`'s directory); returns {bytes, files, key} (key: the manifest's).
        CheckpointError "too_large: …" over max_bytes, "none: …" when there is nothing."""
        top = within or (src.parent if src.is_file() else src)
        files = regular_files(src)
        if not files:
            raise CheckpointError(f"none: nothing at {container_path}")
        total = sum(path.lstat().st_size for _, path in files)
        if total > self.max_bytes:
            raise CheckpointError(f"too_large: {container_path} holds more than the bid's "
                                  f"max_bytes ({self.max_bytes} bytes)")
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        base = f"{self.prefix}{stamp}-lease{int(lease_id)}/"
        entries, total = [], 0
        for rel, path in files:
            f = _open_inside(path, top)
            if f is None:  # swapped for a symlink meanwhile: left out
                continue
            with f:
                size = os.fstat(f.fileno()).st_size
                total += size
                if total > self.max_bytes:
                    raise CheckpointError(f"too_large: {container_path} holds more than the "
                                          f"bid's max_bytes ({self.max_bytes} bytes)")
                entry = {"path": rel, "bytes": size, "sha256": _digest(f)}
                self.s3.upload_fileobj(f, self.bucket, f"{base}files/{rel}")
            entries.append(entry)
        manifest = {"version": 1, "lease": int(lease_id), "created_at": _now(),
                    "path": container_path, "kind": "file" if src.is_file() else "dir",
                    "bytes": total, "files": entries}
        self.s3.put_object(Bucket=self.bucket, Key=base + MANIFEST,
                           Body=json.dumps(manifest, indent=1).encode(),
                           ContentType="application/json")
        return {"bytes": total, "files": len(entries), "key": base + MANIFEST}

    def manifests(self) -> list[str]:
        """The manifest keys under the prefix, newest first."""
        keys = []
        pages = self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix)
        for page in pages:
            keys += [o["Key"] for o in page.get("Contents", [])
                     if o["Key"].endswith("/" + MANIFEST)
                     and o["Key"].count("/") == self.prefix.count("/") + 1]
        return sorted(keys, reverse=True)

    def restore(self, dest: Path) -> dict | None:
        """Put the newest whole checkpoint at `dest` (replacing what is there); None when
        the prefix has none. Returns {bytes, files, key}. CheckpointError when every one
        found is damaged or over max_bytes."""
        problems = []
        for key in self.manifests():
            try:
                return self._restore_one(key, dest)
            except CheckpointError as exc:
                problems.append(f"{key}: {exc}")
        if problems:
            raise CheckpointError("no usable checkpoint: " + "; ".join(problems)[:250])
        return None

    def _restore_one(self, key: str, dest: Path) -> dict:
        body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read(1 << 24)
        try:
            manifest = json.loads(body)
            files = [(_safe_rel(str(e["path"])), int(e["bytes"]), str(e["sha256"]))
                     for e in manifest["files"]]
            kind = manifest.get("kind", "dir")
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"unreadable manifest ({exc.__class__.__name__})") from None
        total = sum(size for _, size, _ in files)
        if total > self.max_bytes:
            raise CheckpointError(f"too_large: {total} bytes, over max_bytes {self.max_bytes}")
        base = key[: -len(MANIFEST)]
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".restore-", dir=dest.parent))
        try:
            for rel, size, sha in files:
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                self.s3.download_file(self.bucket, f"{base}files/{rel}", str(target))
                if target.stat().st_size != size or _sha256(target) != sha:
                    raise CheckpointError(f"{rel} does not match its manifest (size or sha256)")
            source = staging / files[0][0] if kind == "file" and len(files) == 1 else staging
            _replace(source, dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        _open_up(dest)
        return {"bytes": total, "files": len(files), "key": key}


def _replace(source: Path, dest: Path) -> None:
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    elif dest.exists():
        shutil.rmtree(dest)
    os.replace(source, dest)


def _open_up(dest: Path) -> None:
    """Whatever uid the workload runs as, it may read and rewrite its checkpoint."""
    paths = [dest] + (list(dest.rglob("*")) if dest.is_dir() else [])
    for p in paths:
        os.chmod(p, 0o777 if p.is_dir() else 0o666)


class CheckpointSync:
    """The agent's side (module docstring). client: MarketplaceClient (post_checkpoint);
    workspaces: workspace.Workspaces, or None when the runtime has none (a lease with a
    checkpoint then fails before it starts); log: one line per call."""

    def __init__(self, client, workspaces: Workspaces | None,
                 log: Callable[[str], None]) -> None:
        self.client, self.workspaces, self.log = client, workspaces, log
        self._configs: dict[int, dict] = {}  # lease id → its payload `checkpoint`
        self._checked: dict[int, float] = {}  # lease id → monotonic time of the last check
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._locks: dict[int, threading.Lock] = {}  # lease id → one transfer at a time

    def remember(self, lease: RunnerLease) -> None:
        """Keep the listed lease's store: its upload at the end needs it after the lease
        leaves the list."""
        if lease.checkpoint:
            self._configs[lease.id] = dict(lease.checkpoint)

    def restore(self, lease: RunnerLease) -> str | None:
        """Before the workload starts: make the workspace and, when the lease continues a
        chain (`restore`), put the latest checkpoint in it. Returns the failure cause (the
        lease must fail before it runs, charged nothing), else None."""
        cfg = lease.checkpoint
        if not cfg:
            return None
        self.remember(lease)
        if self.workspaces is None:
            return ("checkpoint restore failed: this runner's runtime gives no workspace "
                    "(Docker only)")
        self.workspaces.create(lease.id)
        if not cfg.get("restore"):
            if cfg.get("path") == DEFAULT_PATH:  # the folder the contract names, ready
                folder = self.workspaces.host_path(lease.id, DEFAULT_PATH)
                folder.mkdir(exist_ok=True)
                os.chmod(folder, 0o777)  # noqa: S103 - inside the lease's workspace
            return None
        dest = self.workspaces.host_path(lease.id, cfg["path"])
        started = time.monotonic()
        try:
            done = CheckpointStore(cfg).restore(dest)
        except Exception as exc:
            message = self._message(cfg, exc)
            status = "too_large" if message.startswith("too_large: ") else "failed"
            message = message.removeprefix("too_large: ")
            self._report(lease.id, status, "restore", started, message=message)
            return f"checkpoint restore failed: {message}"[:300]
        if done is None:
            self._report(lease.id, "none", "restore", started)
            return None
        self._report(lease.id, "restored", "restore", started, **done)
        return None

    def over_bound(self, lease: RunnerLease) -> str | None:
        """The failure cause when the running lease's workspace is over its max_bytes
        (checked at most every CHECK_INTERVAL_S), else None."""
        cfg = lease.checkpoint
        if not cfg or self.workspaces is None:
            return None
        now = time.monotonic()
        if now - self._checked.get(lease.id, 0.0) < CHECK_INTERVAL_S:
            return None
        self._checked[lease.id] = now
        used = self.workspaces.usage(lease.id)
        if used > int(cfg["max_bytes"]):
            return (f"the workspace holds {used} bytes, over the bid's checkpoint max_bytes "
                    f"({cfg['max_bytes']})")
        return None

    def upload(self, lease: RunnerLease | int, reason: str, *, wait: bool = False,
               delay_s: float = 0.0) -> None:
        """Upload the lease's checkpoint (in the background unless `wait`), `delay_s` from
        now: the notice sequence calls upload(lease, "notice", delay_s=NOTICE_SETTLE_S)
        once the notice is delivered. A lease's transfers run one at a time, in order."""
        lease_id = lease if isinstance(lease, int) else lease.id
        if not isinstance(lease, int):
            self.remember(lease)

        def later() -> None:
            if delay_s > 0:
                time.sleep(delay_s)
            with self._lease_lock(lease_id):
                self._upload(lease_id, reason)

        self._start(later, wait)

    def finish(self, lease_id: int, reason: str, *, wait: bool = False) -> None:
        """After the workload was stopped: the last upload, then the workspace removed
        (`reason` as checkpoint reports name it, or the stop sequence's: REPORTED_AS)."""
        reason = REPORTED_AS.get(reason, reason)
        if lease_id not in self._configs:
            if self.workspaces is not None:
                self.workspaces.remove(lease_id)
            return

        def last() -> None:
            with self._lease_lock(lease_id):
                try:
                    self._upload(lease_id, reason)
                finally:
                    self._configs.pop(lease_id, None)
                    self._checked.pop(lease_id, None)
                    if self.workspaces is not None:
                        self.workspaces.remove(lease_id)
            with self._lock:
                self._locks.pop(lease_id, None)

        self._start(last, wait)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the transfers under way (tests; the runner's exit)."""
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout)

    def _lease_lock(self, lease_id: int) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(lease_id, threading.Lock())

    def _start(self, work: Callable[[], None], wait: bool) -> None:
        if wait:
            work()
            return
        t = threading.Thread(target=work, name="checkpoint-upload", daemon=True)
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def _upload(self, lease_id: int, reason: str) -> None:
        cfg = self._configs.get(lease_id)
        if cfg is None or self.workspaces is None or not self.workspaces.exists(lease_id):
            return
        started = time.monotonic()
        try:
            src = self.workspaces.host_path(lease_id, cfg["path"])
            done = CheckpointStore(cfg).upload(src, lease_id, cfg["path"],
                                               within=self.workspaces.path(lease_id))
        except Exception as exc:
            message = self._message(cfg, exc)
            status = next((s for s in ("too_large", "none") if message.startswith(s + ": ")),
                          "failed")
            self._report(lease_id, status, reason, started,
                         message=message.removeprefix(status + ": "))
            return
        self._report(lease_id, "uploaded", reason, started, **done)

    @staticmethod
    def _message(cfg: dict, exc: Exception) -> str:
        text = str(exc) or exc.__class__.__name__
        if not isinstance(exc, CheckpointError):
            text = f"{exc.__class__.__name__}: {text}"
        # a key id shorter than a real one (AWS: 20) is no secret worth garbling every
        # message for ("nothing at /wor[redacted]space" for a key id "k")
        key_id = cfg.get("access_key_id", "")
        return redact(text, [cfg.get("secret_access_key", ""),
                             key_id if len(key_id) >= LINE_PART_MIN else ""])[:280]

    def _report(self, lease_id: int, status: str, reason: str, started: float,
                **fields) -> None:
        report = {"status": status, "reason": reason, "at": _now(),
                  "seconds": round(time.monotonic() - started, 3), **fields}
        shown = {k: v for k, v in report.items() if k != "at"}
        self.log(f"lease {lease_id}: checkpoint {shown}")
        try:
            self.client.post_checkpoint(lease_id, report)
        except Exception as exc:  # the report is lost, the lease is not: logged
            self.log(f"lease {lease_id}: checkpoint report not sent: {exc}")
