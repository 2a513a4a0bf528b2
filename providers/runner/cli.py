"""`gpumarket-runner`: register a GPU host with the marketplace and run its leases.

Commands: register, run, inventory, status, doctor, benchmark (`--help` lists the flags).
Flags, environment, config.json, container limits and exit statuses: docs/RUNNER.md
("Commands"); runtimes, signals and running under systemd: docs/RUNNER_PROTOCOL.md
("Starting and stopping `gpumarket-runner run`"). Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import sys
import threading
from pathlib import Path

from . import __version__, cli_parser, mig
from . import benchmark as bench
from .agent import Agent, print_line
from .benchmark import run_benchmark
from .catalog import UnknownGpuProduct
from .client import MarketplaceClient, MarketplaceError, Unauthorized
from .config import (
    EXIT_ERROR,
    EXIT_NO_GPU,
    EXIT_OK,
    EXIT_UNAUTHORIZED,
    CliError,
    load_config,
    marketplace_from,
    node_label,
    require_marketplace,
    resource_policy,
    save_config,
    simulate_id,
    state_dir_from,
    token_source,
)
from .doctor import doctor_checks
from .gpu_processes import load_replay_process_left
from .gpu_text import mig_lines, mig_summary, nvlink_summary
from .images import ImageCache, Prefetcher
from .lease_network import isolation_check
from .metrics_server import serve_metrics
from .nvml import DumpGpus, NoDriverError, NvmlGpus, ReplayError, load_replay_health
from .nvsmi import DumpError
from .push import PushListener
from .runtime import DockerRuntime, ProcessRuntime, RuntimeFailure
from .switch import pick_runtime, previous_runtimes


def load_gpus(simulate: str | None, replay_xid: str | None = None,
              replay_health: str | None = None, replay_process_left: str | None = None,
              state_dir: Path | None = None):
    """NvmlGpus, or DumpGpus(simulate) when a dump is given (with the replays; zeroed UUIDs
    replaced by ones of `state_dir`'s id when given: sim_uuids); CliError
    (code 2) without a driver; CliError (code 1) for a replay without --simulate or an
    unusable replay."""
    if (replay_xid or replay_health or replay_process_left) and not simulate:
        raise CliError("--replay-xid, --replay-health and --replay-process-left need "
                       "--simulate FILE: on a real host XIDs come from NVML events, readings "
                       "and processes from NVML")
    if simulate:
        try:
            health = load_replay_health(replay_health) if replay_health else None
            left = load_replay_process_left(replay_process_left) if replay_process_left \
                else None
            return DumpGpus(simulate, replay_xid=replay_xid, replay_health=health,
                            replay_process_left=left,
                            uuid_salt=simulate_id(state_dir) if state_dir else None)
        except ReplayError as exc:
            raise CliError(str(exc)) from None
    try:
        return NvmlGpus()
    except NoDriverError as exc:
        raise CliError(
            f"no NVIDIA driver found (NVML: {exc}); on a host without a GPU pass "
            "--simulate FILE with a recorded `nvidia-smi -q` dump",
            EXIT_NO_GPU,
        ) from None


def _cmd_inventory(args) -> int:
    inventory = load_gpus(args.simulate).inventory()
    if args.json:
        print(json.dumps({"driver_version": inventory.driver_version,
                          "cuda_version": inventory.cuda_version, "source": inventory.source,
                          "gpus": mig.inventory_items(inventory)}, indent=2))
        return EXIT_OK
    print(f"{inventory.summary()} (source: {inventory.source})")
    for index, gpu in enumerate(inventory.gpus):
        print(f"  GPU {index}  {gpu.pci_bus_id}  {gpu.uuid}  {gpu.product_name}  "
              f"{gpu.gpu_class}  {gpu.memory_mib} MiB  {mig_summary(gpu)}")
        for line in mig_lines(gpu):
            print(f"      {line}")
        if nvlink_summary(gpu):
            print(f"    {nvlink_summary(gpu)}")
    for note in (*inventory.notes, *mig.notes(inventory)):
        print(f"  note: {note}")
    return EXIT_OK


def _cmd_register(args) -> int:
    state_dir = state_dir_from(args.state_dir)
    url, token = require_marketplace(args.url, args.token, {})
    simulate = str(Path(args.simulate).resolve()) if args.simulate else None
    gpus = load_gpus(simulate, state_dir=state_dir)
    inventory = gpus.inventory()
    client = MarketplaceClient(url, token)
    try:
        agent = Agent(client, gpus, runtime=_NoRuntime(), log=lambda _m: None)
        node = agent.announce()
    except Unauthorized as exc:
        exc.args = ("the marketplace does not know this runner token (401): use the token "
                    "shown once when the node was created (POST /api/v1/nodes/), or the "
                    "newest one if it was rotated since (provider portal, or POST "
                    "/api/v1/nodes/<id>/rotate-token/)",)
        raise
    finally:
        client.close()
    save_config(state_dir, {"url": url, "token": token, "simulate": simulate,
                            "node": {"id": node.get("id"), "uid": node.get("uid"),
                                     "name": node.get("name")}})
    slices = mig.summary(inventory)
    print(f"registered node {node.get('name', '?')}: {inventory.summary()}"
          + (f"; offered as {slices}" if slices else ""))
    for note in (*inventory.notes, *mig.notes(inventory)):
        print(f"  note: {note}")
    if not simulate:  # simulated GPUs are not the ones a CUDA stack here would measure
        _benchmark_after_register(url, token, [u.uuid for u in mig.units(inventory)])
    return EXIT_OK


def _benchmark_after_register(url: str, token: str, uuids: list[str]) -> None:
    """Benchmark once after registering when this host has a CUDA Python stack, and report
    it; a failure is printed and does not undo the registration."""
    backend = bench.available()
    if backend is None:
        print("benchmark skipped: no CUDA Python stack (torch with CUDA, or CuPy) on this "
              "host; the listing says \"not benchmarked yet\"")
        return
    print(f"benchmarking the GPUs with {backend} (about a minute)…", flush=True)
    sliced = any(u.startswith("MIG-") for u in uuids)  # one child per unit: run_slices
    result = bench.run_slices(uuids) if sliced else run_benchmark()
    for line in result.lines():
        print(line)
    client = MarketplaceClient(url, token)
    try:
        bench.post_result(client, result, __version__, uuids, print)
    except MarketplaceError as exc:
        print(f"benchmark not reported: {exc}")
    finally:
        client.close()


class _NoRuntime:
    """Stand-in runtime for `register`, which starts nothing."""

    name = "none"
    node = None


def _lock_state_dir(state_dir: Path):
    """One `run` per state dir: a second one would start every lease twice. Returns the
    open lock file (held until the process exits); raises CliError when taken."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if state_dir.stat().st_uid == os.geteuid() and state_dir.stat().st_mode & 0o077:
        os.chmod(state_dir, 0o700)  # the token lives here: the runner's user only
        print_line(f"{state_dir}: made readable by this user only (mode 0700)")
    lock = open(state_dir / "run.lock", "a+")  # noqa: SIM115 - held for the process's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        pid = lock.read().strip() or "?"
        raise CliError(f"another `gpumarket-runner run` (pid {pid}) is using {state_dir}; "
                       "stop it first, or give this one its own --state-dir") from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


class _StopNow(BaseException):
    """Raised by the signal handler on a second SIGTERM/SIGINT: leave whatever the runner
    is doing now (a slow Docker call, an image pull, a benchmark) and exit 0. A
    BaseException, so the loop's `except Exception` does not swallow it."""


def _stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT, in whatever state the runner is: the first sets `stop` (the
    runner finishes the step it is in and exits 0; lease workloads keep running); a
    second one exits at once (_StopNow), still 0 and still without touching a lease."""

    def on_signal(signum, _frame):
        name = signal.Signals(signum).name
        if stop.is_set():
            print_line(f"received {name} again: exiting now; lease workloads keep running")
            raise _StopNow(name)
        stop.set()
        print_line(f"received {name}: stopping (after the current step; {name} again to "
                   "exit at once); lease workloads keep running")

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)


def _cmd_run(args) -> int:
    stop = threading.Event()
    _stop_on_signals(stop)  # first: a signal during the setup below is a clean stop too
    try:
        return _run_until_stopped(args, stop)
    except _StopNow:
        return EXIT_OK


def _run_until_stopped(args, stop: threading.Event) -> int:
    if args.public_host in ("0.0.0.0", "::") and not args.advertise_host:
        raise CliError(f"--public-host {args.public_host} binds every interface: also pass "
                       "--advertise-host NAME, the name or address buyers connect to")
    if args.advertise_host and not args.public_host:
        raise CliError("--advertise-host needs --public-host (the address ports are "
                       "published on)")
    state_dir = state_dir_from(args.state_dir)
    lock = _lock_state_dir(state_dir)  # noqa: F841 - held until exit
    config = load_config(state_dir)
    url, token = require_marketplace(args.url, args.token, config)
    simulate = args.simulate or config.get("simulate")
    gpus = load_gpus(simulate, args.replay_xid, args.replay_health, args.replay_process_left,
                     state_dir)
    for note in gpus.inventory().notes if simulate else ():
        print_line(f"note: {note}")
    node = node_label(config.get("node") or {})
    policy = resource_policy(args, config)
    runtime = pick_runtime(args.runtime, state_dir, node, simulate=bool(simulate),
                           token_on_command_line=bool(args.token), uids=args.process_uids,
                           network_mode=args.network, public_host=args.public_host,
                           advertise_host=args.advertise_host, log=print_line)
    if isinstance(runtime, DockerRuntime):
        runtime.policy, runtime.node_gpus = policy, len(gpus.inventory().gpus)
        runtime.images = ImageCache(runtime.client, state_dir / "images.json",
                                    args.image_cache, log=print_line)
        runtime.puller.allow_private_registry = args.allow_private_registry
        runtime.puller.stall_timeout = args.pull_stall_timeout
        runtime.puller.max_seconds = args.pull_timeout
        if args.network not in ("per-lease", "none", "host"):
            print_line(f"WARNING: every lease on the network {args.network} can reach the "
                       "others' ports (SSH, Jupyter, …); the default --network per-lease "
                       "isolates them (docs/RUNNER.md, \"Lease isolation\")")
        elif args.network == "per-lease":
            isolated, detail, fix = isolation_check()
            if isolated is False:  # doctor FAILs this host: say so where the provider looks
                print_line(f"WARNING: lease isolation: {detail}; buyers' containers on this "
                           f"node can reach each other: {fix}")
        if args.token:
            print_line("note: --token on the command line is readable by every local user "
                       "(`ps`); `gpumarket-runner register` saves it 0600 instead")
    if stop.is_set():  # signalled during the setup: nothing was started
        print_line("stopped before contacting the marketplace; no lease workload touched")
        return EXIT_OK
    client = MarketplaceClient(url, token)
    push = None if args.no_push else PushListener(url, token, log=print_line,
                                                  poll_interval=args.poll_interval)
    agent = Agent(client, gpus, runtime, poll_interval=args.poll_interval,
                  heartbeat_interval=args.heartbeat_interval, grace_s=args.grace,
                  logs_interval=args.logs_interval, push=push)
    agent.previous_runtimes = previous_runtimes(runtime, state_dir, node)
    if isinstance(runtime, DockerRuntime) and not args.no_prefetch:
        agent.prefetcher = Prefetcher(runtime.images, runtime.puller, client.images_wanted,
                                      log=print_line)
    metrics_server = serve_metrics(agent, args.metrics_port, args.metrics_bind)
    if not simulate and args.benchmark_interval > 0:  # simulated GPUs are not measured
        agent.benchmark_schedule = bench.BenchmarkSchedule(args.benchmark_interval)
    how = (f"polling {url} every {args.poll_interval:g} s" if push is None else
           f"leases pushed over {push.url}, polling every {args.poll_interval:g} s while "
           "it is down or its notices are partial")
    print_line(f"gpumarket-runner {__version__}: {how} ({gpus.source})")
    try:
        agent.run(stop)
    except Unauthorized as exc:
        exc.args = (_token_refused(args, url, state_dir, simulate),)
        raise
    finally:
        client.close()
        if metrics_server is not None:
            metrics_server.shutdown()
    return EXIT_OK


def _token_refused(args, url: str, state_dir: Path, simulate: str | None) -> str:
    """What `run` says when the marketplace refuses its token (exit status 3): why that
    happens, and the command that puts the node's current token in place."""
    source = token_source(args.token)
    register = (f"gpumarket-runner register --url {url} --token NEW_TOKEN --state-dir "
                f"{state_dir}" + (f" --simulate {simulate}" if simulate else ""))
    fix = (f"pass the new token in {source} instead" if source else
           f"save the new one with `{register}`, then start `run` again")
    return ("the marketplace refused the runner token (401): it was rotated (provider "
            "portal, or POST /api/v1/nodes/<id>/rotate-token/) or the node was deleted; "
            f"{fix} (restarting with the old token does not help)")


def _cmd_doctor(args) -> int:
    config = load_config(state_dir_from(args.state_dir))
    url, token = marketplace_from(args.url, args.token, config)
    results = doctor_checks(url, token, args.simulate or config.get("simulate"))
    for _ok, line in results:
        print(line, flush=True)
    failed = sum(1 for ok, _ in results if ok is False)
    print(f"{failed} check(s) failed" if failed else "all checks passed")
    return EXIT_ERROR if failed else EXIT_OK


def _cmd_status(args) -> int:
    state_dir = state_dir_from(args.state_dir)
    exists = state_dir.is_dir()
    config = load_config(state_dir) if exists else {}
    node = config.get("node") or {}
    url, token = marketplace_from(None, None, config)  # `status` has no --url/--token
    print(f"state dir:   {state_dir}" + ("" if exists else " (does not exist)"))
    print(f"marketplace: {url or 'not set'}")
    print(f"token:       {'set (not shown)' if token else 'not set'}")
    print(f"node:        {node.get('name') or '?'} (id {node.get('id') or '?'})"
          if node else "node:        not registered")
    simulated = config.get("simulate")
    print(f"GPUs:        {'simulated from ' + simulated if simulated else 'NVML'}")
    for line in _status_leases(state_dir, exists, node_label(node)):
        print(line)
    return EXIT_OK


def _status_leases(state_dir: Path, exists: bool, node: str | None) -> list[str]:
    """The `leases:` lines of `status`: the workloads in each runtime that has some, or
    precisely why none can be listed (no state dir, not registered, no Docker Engine)."""
    runtimes, why = [], []
    if not exists:
        why.append(f"the state dir does not exist (nothing registered there: run "
                   f"`gpumarket-runner register --state-dir {state_dir}`, or pass the "
                   "--state-dir that `register` used)")
    elif node is None:
        config = state_dir / "config.json"
        what = f"{config} names no node" if config.exists() else f"no {config}"
        why.append(f"not registered ({what}: run `gpumarket-runner register --state-dir "
                   f"{state_dir}`), so no container can be told to be this node's")
    else:
        try:
            runtimes.append(DockerRuntime(node))
        except RuntimeFailure as exc:
            why.append(str(exc))
    if exists and (state_dir / "processes" / "processes.json").exists():
        runtimes.append(ProcessRuntime(state_dir))
    lines = []
    for runtime in runtimes:
        workloads = runtime.describe()
        where = "Docker containers of node " + node if runtime.name == "docker" else \
            f"local processes of {state_dir / 'processes'}"
        lines.append(f"leases:      {len(workloads)} workload(s) in the {runtime.name} "
                     f"runtime ({where})")
        for w in workloads:
            handle = w["handle"] if w["handle"].startswith("pid-") else w["handle"][:12]
            gpus = f"  GPUs {w['gpus']}" if w["gpus"] else ""
            lines.append(f"  lease {w['lease']}  {handle}  {w['state']}{gpus}")
    if why:
        lines.append("leases:      " + ("cannot list the Docker containers: " if runtimes
                                         else "none listed: ") + "; ".join(why))
    return lines


def _cmd_benchmark(args) -> int:
    """Measure; print; report to the marketplace when one is configured (flags, environment
    or the registered config) unless --no-post. Without a GPU: the reason, exit 2, nothing
    reported."""
    result = run_benchmark()
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        for line in result.lines():
            print(line)
    if not result.ran:
        return EXIT_NO_GPU
    config = load_config(state_dir_from(args.state_dir))
    url, token = marketplace_from(args.url, args.token, config)
    if args.no_post or not (url and token):
        return EXIT_OK
    url, token = require_marketplace(url, token, config)
    simulate = config.get("simulate")
    uuids = None if simulate else [u.uuid for u in mig.units(load_gpus(None).inventory())]
    client = MarketplaceClient(url, token)
    log = (lambda m: print(m, file=sys.stderr)) if args.json else print
    try:
        bench.post_result(client, result, __version__, uuids, log)
    finally:
        client.close()
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The runner's parser (cli_parser.py), each command bound to its function here."""
    return cli_parser.build_parser({
        "register": _cmd_register, "run": _cmd_run, "doctor": _cmd_doctor,
        "status": _cmd_status, "benchmark": _cmd_benchmark, "inventory": _cmd_inventory})


def main(argv: list[str] | None = None) -> int:
    """Run the CLI with `argv` (default sys.argv[1:]); return the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CliError as exc:
        message, code = str(exc), exc.code
    except DumpError as exc:
        what = "cannot read the nvidia-smi dump" if "cannot read the file" in str(exc) \
            else "malformed nvidia-smi dump"
        message, code = f"{what}: {exc}", EXIT_NO_GPU
    except Unauthorized as exc:
        message, code = str(exc), EXIT_UNAUTHORIZED
    except (MarketplaceError, UnknownGpuProduct, RuntimeFailure) as exc:
        message, code = str(exc), EXIT_ERROR
    except KeyboardInterrupt:
        message, code = "interrupted", EXIT_ERROR
    except Exception as exc:  # last resort: one line, never a traceback
        message, code = f"unexpected error: {exc.__class__.__name__}: {exc}", EXIT_ERROR
    print(f"gpumarket-runner: {message}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
