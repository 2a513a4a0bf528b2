"""Lease workloads as local processes: the process runtime, used only when chosen
explicitly (`gpumarket-runner run --runtime process`; `auto` never picks it).

What it keeps from a workload, and nothing more:
- the runner's user: as root, each lease runs as a user of its own, a uid from `uids`
  (default DEFAULT_UIDS) with no passwd entry, no running process and no other lease of
  this state dir, its gid the same number, no supplementary groups. Not root (`isolated`
  False), the workload runs as the runner's own user and CAN read its token: the CLI
  allows that only with --simulate, and says so (cli.py);
- the runner's environment: the workload gets the lease's env, NVIDIA_VISIBLE_DEVICES and
  CUDA_VISIBLE_DEVICES (the leased GPU or MIG UUIDs), BASE_ENV (PATH, LANG), HOME and
  TMPDIR = its working directory, nothing else;
- the state dir: 0700, its files 0600 (the runner's user only); the workload's working
  directory is elsewhere: <system temp dir>/gpumarket-lease-<id>-XXXX/work (the outer
  directory the runner's, 0711; `work` the lease user's, 0700), removed with the workload,
  as are the files its uid left at the top of /tmp, /var/tmp and /dev/shm.
Nothing else is isolated (NOTICE): the workload can open every GPU of the host
(NVIDIA_VISIBLE_DEVICES only names the leased ones), has no memory, CPU or pids limit, uses
the host's network, and sees the host's processes and world-readable files.

Each lease runs under a wrapper (`python -I`, the runner's user, an empty environment: the
lease's env never reaches a process of the runner's user) that reads its spec on stdin,
starts the command as the lease's user and writes the exit code into the state dir, so the
code survives a runner restart; it outlives the notice signals and SIGTERM (only its
workload acts on them). stop: SIGTERM to the wrapper's process group and to every
process of the lease's uid, SIGKILL after the grace period; as root the signal is sent
with kill(-1) from the lease's uid (`/bin/sh -c 'kill -- -1'`), which also reaches a
process that left the group.

The notice (notice.py): <outer directory>/notice, the runner's (0755; the file 0644), its
file's path in the workload's GPUMARKET_NOTICE_FILE; `send_signal` signals as stop does.

processes.json in <state dir>/processes: {lease id: {pid, start, log, status_file, gpus,
uid, home}} (uid and home: None when not isolated, absent in an older runner's entries).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from . import notice
from .lease import RunnerLease
from .runtime_common import RuntimeFailure, lease_env

DEFAULT_UIDS = range(60100, 61100)  # Debian's 60000-64999: never a regular or system user
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")  # noqa: S108 - where any user may leave files

NOTICE = ("process runtime: each lease runs as a local process{who}, with only the lease's "
          "environment and a working directory of its own. NOTHING ELSE IS ISOLATED: it can "
          "open every GPU of this host (NVIDIA_VISIBLE_DEVICES only names the leased ones), "
          "has no memory, CPU or pids limit, uses the host's network, sees the host's "
          "processes and world-readable files; images are ignored. Use Docker for a node "
          "that sells to others.")

# Runs as the runner's user with an empty environment; its spec arrives on stdin.
_WRAPPER = r"""
import json, os, signal, subprocess, sys
# a notice's signal (and the stop's SIGTERM) is for the workload: the wrapper waits on; a
# handler, not SIG_IGN, so that the workload gets the default disposition back at exec
for name in ("SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP", "SIGTERM"):
    signal.signal(getattr(signal, name), lambda *_: None)
spec = json.loads(sys.stdin.read())
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
drop = spec["uid"] is not None
try:
    child = subprocess.Popen(spec["command"], env=spec["env"], cwd=spec["cwd"],
                             user=spec["uid"], group=spec["uid"],
                             extra_groups=[] if drop else None, umask=0o077)
    code = child.wait()
    code = 128 - code if code < 0 else code
except OSError as exc:
    print("gpumarket-runner: cannot start %s: %s" % (spec["command"][0], exc.strerror or exc),
          file=sys.stderr, flush=True)
    code = 127
fd = os.open(spec["status_file"] + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
os.write(fd, str(code).encode())
os.close(fd)
os.replace(spec["status_file"] + ".tmp", spec["status_file"])
"""



def _proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks), to tell pid reuse apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def pids_of_uid(uid: int) -> list[int]:
    """The live (not zombie) processes whose real uid is `uid`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("State", "").strip().startswith("Z"):
            continue
        uids = fields.get("Uid", "").split()
        if uids and int(uids[0]) == uid:
            found.append(int(entry.name))
    return found


def _private_file(path: Path) -> int:
    """Open `path` for appending, created 0600; return the descriptor."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


class ProcessRuntime:
    """Lease commands as local processes (module docstring: what is isolated and what is
    not). The image is ignored. state_dir: where `processes/` lives (processes.json, each
    lease's log and exit-status file), so a restarted runner re-adopts them. uids: the
    range lease users are taken from (as root). work_root: where the working directories
    go (default: the system temp dir)."""

    name = "process"
    node = ""  # processes carry no node label
    last_check = "not run: processes are not isolated"

    def __init__(self, state_dir: str | Path, *, uids: range = DEFAULT_UIDS,
                 work_root: str | Path | None = None) -> None:
        self.dir = Path(state_dir) / "processes"
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for path in (self.dir.parent, self.dir):  # the lease users must not read them
            with contextlib.suppress(OSError):
                if path.stat().st_uid == os.geteuid():
                    os.chmod(path, 0o700)
        self._db = self.dir / "processes.json"
        self._children: dict[int, subprocess.Popen] = {}
        self.uids = uids
        self.work_root = Path(work_root or tempfile.gettempdir())
        self.isolated = os.geteuid() == 0

    def notice(self) -> str:
        """The startup line: what this runtime isolates (the user) and what it does not."""
        if self.isolated:
            who = (f", each as a user of its own (uid {self.uids.start}-{self.uids.stop - 1}, "
                   "no groups)")
        else:
            who = f" as the runner's own user {pwd.getpwuid(os.geteuid()).pw_name}"
        return NOTICE.format(who=who)

    # -- state ---------------------------------------------------------------------------
    def _load(self) -> dict[int, dict]:
        try:
            return {int(k): v for k, v in json.loads(self._db.read_text()).items()}
        except (OSError, ValueError):
            return {}

    def _save(self, entries: dict[int, dict]) -> None:
        tmp = self._db.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({str(k): v for k, v in entries.items()}, out)
        tmp.replace(self._db)

    def _alive(self, entry: dict) -> bool:
        pid = entry["pid"]
        child = self._children.get(pid)
        if child is not None:
            return child.poll() is None
        start = _proc_start_time(pid)
        return start is not None and start == entry.get("start")

    def _free_uid(self, lease_id: int, entries: dict[int, dict]) -> int:
        """A uid of `uids` for the lease: no passwd entry, no process, no other lease here.
        RuntimeFailure when the range is used up."""
        taken = {e.get("uid") for e in entries.values()}
        size = len(self.uids)
        for step in range(size):
            uid = self.uids[(lease_id + step) % size]
            if uid in taken:
                continue
            try:
                pwd.getpwuid(uid)
                continue  # a real user has it
            except KeyError:
                pass
            if not pids_of_uid(uid):
                return uid
        raise RuntimeFailure(f"no free lease user in uids {self.uids.start}-"
                             f"{self.uids.stop - 1}")

    def _make_home(self, lease_id: int, uid: int | None) -> Path:
        """<work_root>/gpumarket-lease-<id>-XXXX/work: the outer directory the runner's
        (0711, so the lease user cannot rename it away), `work` the lease user's (0700)."""
        outer = Path(tempfile.mkdtemp(prefix=f"gpumarket-lease-{lease_id}-",
                                      dir=self.work_root))
        os.chmod(outer, 0o711)  # noqa: S103 - traversable, not listable
        home = outer / "work"
        home.mkdir(mode=0o700)
        if uid is not None:
            os.chown(home, uid, uid)
        return home

    # -- the interface (runtime.py) --------------------------------------------------------
    def start(self, lease: RunnerLease | Mapping) -> str:
        """Start the lease's command (a new session); return "pid-<pid>" (the wrapper's
        pid). Idempotent per lease id. RuntimeFailure if it cannot run."""
        lease = RunnerLease.of(lease)
        lease_id = lease.id
        entries = self._load()
        if lease_id in entries:
            return f"pid-{entries[lease_id]['pid']}"
        if lease.ssh_authorized_keys or "ssh" in lease.port_roles.values():
            raise RuntimeFailure("SSH access is not offered by the process runtime (a "
                                 "process has no sshd and no port of its own): this node "
                                 "needs the Docker runtime for a lease with ssh")
        command = [str(c) for c in (lease.command or [])]
        if not command:
            raise RuntimeFailure("the process runtime needs a command (it cannot run an image)")
        uid = self._free_uid(lease_id, entries) if self.isolated else None
        try:
            home = self._make_home(lease_id, uid)
        except OSError as exc:
            raise RuntimeFailure(f"cannot make the lease's working directory in "
                                 f"{self.work_root}: {exc.strerror or exc}") from None
        status_file = self.dir / f"lease-{lease_id}.status"
        log = self.dir / f"lease-{lease_id}.log"
        status_file.unlink(missing_ok=True)
        notices = notice.make_dir(home.parent / "notice")
        env = {**BASE_ENV, "HOME": str(home), "TMPDIR": str(home),
               **lease_env(lease, str(notices / notice.FILE_NAME))}
        # no container toolkit reads NVIDIA_VISIBLE_DEVICES here: CUDA itself is told which
        # devices to use, by UUID ("GPU-…", or "MIG-…" for a lease of MIG slices)
        env["CUDA_VISIBLE_DEVICES"] = env["NVIDIA_VISIBLE_DEVICES"]
        spec = {"command": command, "env": env, "cwd": str(home), "uid": uid,
                "status_file": str(status_file)}
        out = _private_file(log)
        try:
            child = subprocess.Popen(
                [sys.executable, "-I", "-c", _WRAPPER], stdin=subprocess.PIPE, stdout=out,
                stderr=subprocess.STDOUT, env={}, start_new_session=True)
        except OSError as exc:
            shutil.rmtree(home.parent, ignore_errors=True)
            raise RuntimeFailure(f"cannot start {command[0]}: {exc.strerror or exc}") from None
        finally:
            os.close(out)
        child.stdin.write(json.dumps(spec).encode())
        child.stdin.close()
        self._children[child.pid] = child
        entries[lease_id] = {"pid": child.pid, "start": _proc_start_time(child.pid),
                             "status_file": str(status_file), "log": str(log),
                             "gpus": env["NVIDIA_VISIBLE_DEVICES"], "uid": uid,
                             "home": str(home)}
        self._save(entries)
        return f"pid-{child.pid}"

    def notice_dir(self, lease_id: int) -> Path:
        """The lease's notice directory (next to its working directory). RuntimeFailure
        for a lease without a process."""
        entry = self._load().get(lease_id)
        if entry is None or not entry.get("home"):
            raise RuntimeFailure(f"lease {lease_id} has no process")
        return Path(entry["home"]).parent / "notice"

    def send_signal(self, lease_id: int, name: str) -> None:
        """Signal `name` ("SIGUSR1", …) to the lease's processes, as stop signals them."""
        entry = self._load().get(lease_id)
        if entry is None:
            raise RuntimeFailure(f"lease {lease_id} has no process")
        # once to each process: a second one could come after its handler is gone (a
        # Python workload restores the default disposition while it exits)
        self._signal(entry, signal.Signals[name], group=entry.get("uid") is None
                     or os.geteuid() != 0)

    def _signal(self, entry: dict, sig: int, group: bool = True) -> None:
        """`sig` to the wrapper's process group (unless not `group`) and, as root, to
        every process of the lease's uid (kill(-1) sent from that uid)."""
        if group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(entry["pid"], sig)
        uid = entry.get("uid")
        if uid is not None and os.geteuid() == 0:
            # the shell's kill(-1): every process that uid may signal, the caller excepted
            name = signal.Signals(sig).name.removeprefix("SIG")
            subprocess.run(["/bin/sh", "-c", f"kill -s {name} -- -1"], env=dict(BASE_ENV),
                           user=uid, group=uid, extra_groups=[], check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _running(self, entry: dict) -> bool:
        uid = entry.get("uid")
        return self._alive(entry) or (uid is not None and bool(pids_of_uid(uid)))

    def stop(self, lease_id: int, grace_s: float = 10) -> None:
        """SIGTERM the lease's processes, SIGKILL after grace_s seconds; remove its working
        directory and the files its user left in SHARED_TMP; forget it."""
        entries = self._load()
        entry = entries.pop(lease_id, None)
        if entry is None:
            return
        if self._running(entry):
            self._signal(entry, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self._running(entry) and time.monotonic() < deadline:
                time.sleep(0.05)
            for _ in range(20):  # a process forked between two rounds gets the next one
                if not self._running(entry):
                    break
                self._signal(entry, signal.SIGKILL)
                time.sleep(0.05)
        child = self._children.pop(entry["pid"], None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
        if entry.get("home"):
            shutil.rmtree(Path(entry["home"]).parent, ignore_errors=True)
        if entry.get("uid") is not None:
            _remove_files_of(entry["uid"])
        Path(entry["status_file"]).unlink(missing_ok=True)
        self._save(entries)

    def list_leases(self) -> dict[int, str]:
        """{lease id: "pid-<pid>"} for every process started and not yet stopped."""
        return {lease_id: f"pid-{e['pid']}" for lease_id, e in self._load().items()}

    def describe(self) -> list[dict]:
        """For `status`: lease, handle ("pid-N"), name (the log file), state ("running" or
        "exited"), gpus (the NVIDIA_VISIBLE_DEVICES it was started with; "" when started by
        an older runner that did not record them)."""
        out = []
        for lease_id, entry in sorted(self._load().items()):
            out.append({"lease": lease_id, "handle": f"pid-{entry['pid']}",
                        "name": entry.get("log", ""),
                        "state": "running" if self._alive(entry) else "exited",
                        "gpus": entry.get("gpus", "")})
        return out

    def logs(self, lease_id: int, lines: int = 200) -> str:
        """The last `lines` lines of the process's captured output (at most its last
        256 KiB are read)."""
        entry = self._load().get(lease_id)
        if entry is None:
            raise RuntimeFailure(f"lease {lease_id} has no process")
        try:
            with open(entry["log"], "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 256 * 1024))
                raw = f.read()
        except OSError:
            return ""
        kept = raw.decode("utf-8", "replace").splitlines(keepends=True)[-max(1, int(lines)):]
        return "".join(kept)

    def verify_gpus(self, lease: RunnerLease | Mapping) -> str | None:
        """Processes are not isolated: nothing to check from inside."""
        return None

    def endpoints(self, lease: RunnerLease | Mapping) -> None:
        """None: a process binds where it binds; nothing is published (nor reported)."""
        return None

    def exit_status(self, lease_id: int) -> int | None:
        """None while it runs; its exit code after (128+N for signal N; 127 if the command
        could not start; 255 if the code was lost, e.g. the wrapper itself was killed).
        RuntimeFailure if unknown lease."""
        entry = self._load().get(lease_id)
        if entry is None:
            raise RuntimeFailure(f"lease {lease_id} has no process")
        if self._alive(entry):
            return None
        child = self._children.get(entry["pid"])
        if child is not None:
            child.wait()
        try:
            return int(Path(entry["status_file"]).read_text().strip())
        except (OSError, ValueError):
            return 255


def _remove_files_of(uid: int) -> None:
    """Remove what user `uid` left at the top of SHARED_TMP (a later lease may get the same
    uid). Symlinks are unlinked, never followed."""
    for where in SHARED_TMP:
        try:
            entries = list(os.scandir(where))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue
