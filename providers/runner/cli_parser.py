"""The command line of `gpumarket-runner` (cli.py runs it): the parser of every command
and the types of its flags. A usage error is one line on stderr and exit status 1; the
flags are documented in docs/RUNNER.md ("Commands")."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping

from . import __version__
from . import benchmark as bench
from .config import DEFAULT_STATE_DIR, EXIT_ERROR
from .images import DEFAULT_BOUND, parse_size
from .process_runtime import DEFAULT_UIDS
from .pull import MAX_PULL_S, STALL_TIMEOUT_S


def _uid_range(value: str) -> range:
    """--process-uids FIRST-LAST → range(FIRST, LAST + 1); argparse error otherwise."""
    first, sep, last = value.partition("-")
    try:
        lo, hi = int(first), int(last)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not FIRST-LAST (e.g. 60100-61099)") \
            from None
    if not sep or not 1000 <= lo <= hi < 2**32 - 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be FIRST-LAST with 1000 <= FIRST "
                                         f"<= LAST < {2**32 - 1}")
    return range(lo, hi + 1)


MAX_SECONDS = 365 * 24 * 3600  # one year: longer waits are a typo (and overflow timers)
PULL_MIN_S, PULL_MAX_S = 1.0, 7 * 24 * 3600.0  # bounds of --pull-stall-timeout, --pull-timeout


def _seconds(value: str, *, zero: bool) -> float:
    """A finite number of seconds from a flag: > 0 (zero=False) or >= 0 (zero=True), at
    most MAX_SECONDS. argparse.ArgumentTypeError naming the value otherwise (NaN and
    infinity included)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"{value!r} is not a finite number")
    if number < 0 or (number == 0 and not zero):
        raise argparse.ArgumentTypeError(f"{value!r} must be {'>= 0' if zero else '> 0'}")
    if number > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{value!r} must be at most {MAX_SECONDS} "
                                         "(a year)")
    return number


def _positive(value: str) -> float:
    """Seconds > 0 (intervals)."""
    return _seconds(value, zero=False)


def _non_negative(value: str) -> float:
    """Seconds >= 0 (--grace: 0 kills at once; --benchmark-interval: 0 never)."""
    return _seconds(value, zero=True)


def _pull_seconds(value: str) -> float:
    """--pull-stall-timeout, --pull-timeout: seconds from PULL_MIN_S to PULL_MAX_S."""
    number = _seconds(value, zero=False)
    if not PULL_MIN_S <= number <= PULL_MAX_S:
        raise argparse.ArgumentTypeError(f"{value!r} must be from {PULL_MIN_S:.0f} to "
                                         f"{PULL_MAX_S:.0f} seconds")
    return number


def _size(value: str) -> int:
    """Bytes from a size (--image-cache 200g); argparse's error names the flag."""
    try:
        return parse_size(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 1 (2 is reserved
    for "no NVIDIA driver / bad dump")."""

    def error(self, message: str):
        self.exit(EXIT_ERROR, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser(commands: Mapping[str, Callable]) -> argparse.ArgumentParser:
    """The parser of every command; `commands` maps each command name to its function
    (set as `func`)."""
    parser = _Parser(
        prog="gpumarket-runner",
        description="Provider agent of gpumarket: registers this host's GPUs and runs leases.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    simulate_help = ("read the GPUs from this recorded `nvidia-smi -q` (or `-q -x`) dump "
                     "instead of NVML; a <base>.L.txt next to it names MIG devices; or a "
                     "directory holding the dump (docs/RUNNER.md)")
    state_help = f"state directory (env GPUMARKET_RUNNER_STATE_DIR; default {DEFAULT_STATE_DIR})"

    reg = sub.add_parser("register", help="send this host's GPUs to the marketplace")
    reg.add_argument("--url", help="marketplace base URL (env GPUMARKET_URL)")
    reg.add_argument("--token", help="runner token of the node (env GPUMARKET_RUNNER_TOKEN)")
    reg.add_argument("--simulate", metavar="PATH", help=simulate_help)
    reg.add_argument("--state-dir", metavar="DIR", help=state_help)
    reg.set_defaults(func=commands["register"])

    run = sub.add_parser("run", help="heartbeat and run this node's leases until stopped")
    run.add_argument("--state-dir", metavar="DIR", help=state_help)
    run.add_argument("--url", help="override the registered marketplace URL")
    run.add_argument("--token", help="override the registered runner token")
    run.add_argument("--simulate", metavar="PATH", help=simulate_help)
    run.add_argument("--poll-interval", type=_positive, default=2.0, metavar="S",
                     help="seconds between lease polls while the push websocket is down "
                          "(default 2)")
    run.add_argument("--no-push", action="store_true",
                     help="do not open the push websocket (/ws/runner/): poll only")
    run.add_argument("--heartbeat-interval", type=_positive, default=10.0, metavar="S",
                     help="seconds between heartbeats (default 10)")
    run.add_argument("--logs-interval", type=_positive, default=5.0, metavar="S",
                     help="seconds between log tails sent for the buyer (default 5)")
    run.add_argument("--grace", type=_non_negative, default=10.0, metavar="S",
                     help="seconds between SIGTERM and SIGKILL when stopping a lease's "
                          "workload, for a lease that names no stop_grace_seconds "
                          "(default 10; 0: SIGKILL at once)")
    run.add_argument("--network", metavar="NAME", default="per-lease",
                     help="Docker network of lease containers (default per-lease: a bridge "
                          "of each lease's own, removed with it, so no lease reaches "
                          "another's ports; `doctor` says what the host must add); none, "
                          "host, or a shared network's NAME (its leases reach each other)")
    run.add_argument("--public-host", metavar="ADDR", default=None,
                     help="publish the container ports a lease asks for (its `ports`) on this "
                          "address of the host, at ports the engine picks, and report them to "
                          "the buyer (default: none, nothing is published)")
    run.add_argument("--advertise-host", metavar="NAME", default=None,
                     help="the host name or address buyers connect to (default: "
                          "--public-host; required when that is 0.0.0.0 or ::)")
    run.add_argument("--memory-per-gpu", metavar="SIZE",
                     help="memory limit of a lease container per leased GPU, e.g. 64g "
                          "(default: the host's memory × leased GPUs / the node's GPUs)")
    run.add_argument("--cpus-per-gpu", metavar="N",
                     help="CPUs of a lease container per leased GPU, e.g. 12 (default: the "
                          "host's CPUs × leased GPUs / the node's GPUs)")
    run.add_argument("--pids-limit", metavar="N",
                     help="processes (and threads) per lease container (default 4096)")
    run.add_argument("--shm-size", metavar="SIZE",
                     help="size of a lease container's shared memory (/dev/shm), e.g. "
                          "8g (default: half its memory limit, at most 16g)")
    run.add_argument("--image-cache", type=_size, default=DEFAULT_BOUND, metavar="SIZE",
                     help="bound on the images the runner pulls (200g; least recently used "
                          "evicted first, never one a lease uses; docs/IMAGES.md)")
    run.add_argument("--pull-stall-timeout", type=_pull_seconds, default=STALL_TIMEOUT_S,
                     metavar="S", help="fail a lease whose image pull makes no progress for "
                     f"S seconds (default {STALL_TIMEOUT_S:.0f}; {PULL_MIN_S:.0f} to "
                     f"{PULL_MAX_S:.0f}; docs/IMAGES.md)")
    run.add_argument("--pull-timeout", type=_pull_seconds, default=MAX_PULL_S, metavar="S",
                     help=f"fail a lease whose image pull takes longer than S seconds "
                     f"(default {MAX_PULL_S:.0f} = 6 h; at most {PULL_MAX_S:.0f})")
    run.add_argument("--no-prefetch", action="store_true",
                     default=os.environ.get("GPUMARKET_RUNNER_NO_PREFETCH") == "1",
                     help="never pre-pull the marketplace's wanted images while idle "
                          "(also when GPUMARKET_RUNNER_NO_PREFETCH=1)")
    run.add_argument("--allow-private-registry", action="store_true",
                     help="pull images from a registry at localhost or a private, loopback "
                          "or link-local address (refused by default: a buyer's image "
                          "would make this host connect into its own network)")
    run.add_argument("--runtime", choices=("auto", "docker", "process"), default="auto",
                     help="auto (default) and docker: lease containers on the Docker Engine "
                          "(an error when none answers); process: local processes, each as "
                          "a user of its own (needs root), isolating nothing else")
    run.add_argument("--process-uids", metavar="FIRST-LAST", type=_uid_range,
                     default=DEFAULT_UIDS,
                     help="uids the process runtime gives lease users, one per running "
                          f"lease (default {DEFAULT_UIDS.start}-{DEFAULT_UIDS.stop - 1}; no "
                          "passwd entries needed)")
    run.add_argument("--benchmark-interval", type=_non_negative,
                     default=bench.DEFAULT_INTERVAL_S,
                     metavar="S", help="re-run the benchmark every S seconds while no lease "
                     "runs (default 86400 = 24 h; 0: never; needs torch or CuPy and a GPU)")
    run.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                     help="serve Prometheus /metrics (DCGM-exporter names) on this port "
                          "(default: off)")
    run.add_argument("--metrics-bind", default="127.0.0.1", metavar="ADDR",
                     help="address the metrics port listens on (default 127.0.0.1)")
    run.add_argument("--replay-xid", metavar="LOG",
                     help="with --simulate: replay the XID lines of this kernel log")
    run.add_argument("--replay-health", metavar="JSON",
                     help='with --simulate: readings over the dump\'s, e.g. '
                          '\'{"GPU-…": {"temperature_c": 95}}\' (inline or a file)')
    run.add_argument("--replay-process-left", metavar="JSON",
                     help='with --simulate: processes that appear on a GPU when the first '
                          'lease workload on it is removed (a leftover), e.g. \'{"GPU-…": '
                          '[{"pid": 4242, "name": "python"}]}\' (inline or a file)')
    run.set_defaults(func=commands["run"])

    doc = sub.add_parser("doctor", help="check driver, Docker, NVIDIA runtime, clock and "
                                        "marketplace; one PASS/FAIL line each")
    doc.add_argument("--state-dir", metavar="DIR", help=state_help)
    doc.add_argument("--url", help="marketplace base URL (default: the registered one)")
    doc.add_argument("--token", help="runner token (default: the registered one)")
    doc.add_argument("--simulate", metavar="PATH",
                     help=simulate_help + "; default: the registered one's, if any")
    doc.set_defaults(func=commands["doctor"])

    st = sub.add_parser("status", help="print the configuration (never the token) and the "
                                       "lease workloads this runner manages")
    st.add_argument("--state-dir", metavar="DIR", help=state_help)
    st.set_defaults(func=commands["status"])

    bm = sub.add_parser("benchmark", help="measure matmul throughput and memory bandwidth "
                                          "(needs a GPU and torch or CuPy) and report them "
                                          "to the marketplace when registered")
    bm.add_argument("--json", action="store_true", help="print JSON")
    bm.add_argument("--state-dir", metavar="DIR", help=state_help)
    bm.add_argument("--url", help="marketplace base URL (default: the registered one)")
    bm.add_argument("--token", help="runner token (default: the registered one)")
    bm.add_argument("--no-post", action="store_true",
                    help="only print: report nothing to the marketplace")
    bm.set_defaults(func=commands["benchmark"])

    inv = sub.add_parser("inventory", help="print this host's GPUs; contacts nobody")
    inv.add_argument("--simulate", metavar="PATH", help=simulate_help)
    inv.add_argument("--json", action="store_true", help="print JSON (the inventory body)")
    inv.set_defaults(func=commands["inventory"])
    return parser
