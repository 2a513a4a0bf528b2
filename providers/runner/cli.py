"""`gpumarket-runner`: register a GPU host with the marketplace and run its leases.

    gpumarket-runner register --url URL --token TOKEN [--simulate FILE] [--state-dir DIR]
    gpumarket-runner run [--state-dir DIR] [--poll-interval S] [--heartbeat-interval S]
                         [--network MODE] [--runtime auto|docker|process] [--grace S]
    gpumarket-runner inventory [--simulate FILE] [--json]

Environment: GPUMARKET_URL, GPUMARKET_RUNNER_TOKEN, GPUMARKET_RUNNER_STATE_DIR stand in for
--url, --token, --state-dir. `register` saves {url, token, simulate, node} in
<state dir>/config.json (mode 0600); `run` reads it.

Exit status: 0 ok; 2 no NVIDIA driver (and no --simulate) or a malformed dump; 3 the
marketplace refused the runner token; 1 any other error. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from . import __version__
from .agent import Agent, print_line
from .catalog import UnknownGpuProduct
from .client import MarketplaceClient, MarketplaceError, Unauthorized
from .nvml import DumpGpus, NoDriverError, NvmlGpus
from .nvsmi import DumpError
from .runtime import DockerRuntime, ProcessRuntime, RuntimeFailure, docker_host

EXIT_OK, EXIT_ERROR, EXIT_NO_GPU, EXIT_UNAUTHORIZED = 0, 1, 2, 3
DEFAULT_STATE_DIR = "~/.gpumarket-runner"


class CliError(Exception):
    """A failure to show as one line on stderr; `code` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def _state_dir(value: str | None) -> Path:
    raw = value or os.environ.get("GPUMARKET_RUNNER_STATE_DIR") or DEFAULT_STATE_DIR
    return Path(raw).expanduser()


def load_gpus(simulate: str | None):
    """NvmlGpus, or DumpGpus(simulate) when a dump is given; CliError(code 2) otherwise."""
    if simulate:
        return DumpGpus(simulate)
    try:
        return NvmlGpus()
    except NoDriverError as exc:
        raise CliError(
            f"no NVIDIA driver found (NVML: {exc}); on a host without a GPU pass "
            "--simulate FILE with a recorded `nvidia-smi -q` dump",
            EXIT_NO_GPU,
        ) from None


def save_config(state_dir: Path, config: dict) -> Path:
    """Write config.json readable by the owner only (0600); return its path."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir / "config.json"
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(config, out, indent=2)
    os.chmod(tmp, 0o600)
    tmp.replace(path)
    return path


def load_config(state_dir: Path) -> dict:
    """Read config.json; {} when absent. CliError when unreadable."""
    path = state_dir / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {path}: {exc}") from None


def _cmd_inventory(args) -> int:
    inventory = load_gpus(args.simulate).inventory()
    if args.json:
        print(json.dumps({"driver_version": inventory.driver_version,
                          "cuda_version": inventory.cuda_version, "source": inventory.source,
                          "gpus": [g.as_protocol() for g in inventory.gpus]}, indent=2))
        return EXIT_OK
    print(f"{inventory.summary()} (source: {inventory.source})")
    for gpu in inventory.gpus:
        print(f"  {gpu.pci_bus_id}  {gpu.uuid}  {gpu.product_name}  {gpu.gpu_class}  "
              f"{gpu.memory_mib} MiB  MIG {gpu.mig_mode}")
    return EXIT_OK


def _url_and_token(args, config: dict) -> tuple[str, str]:
    url = args.url or os.environ.get("GPUMARKET_URL") or config.get("url")
    token = args.token or os.environ.get("GPUMARKET_RUNNER_TOKEN") or config.get("token")
    if not url or not token:
        missing = " and ".join(n for n, v in (("--url", url), ("--token", token)) if not v)
        raise CliError(f"missing {missing}: pass it on the command line, set GPUMARKET_URL / "
                       "GPUMARKET_RUNNER_TOKEN, or run `gpumarket-runner register` first")
    return url, token


def _cmd_register(args) -> int:
    state_dir = _state_dir(args.state_dir)
    url, token = _url_and_token(args, {})
    simulate = str(Path(args.simulate).resolve()) if args.simulate else None
    gpus = load_gpus(simulate)
    inventory = gpus.inventory()
    client = MarketplaceClient(url, token)
    try:
        agent = Agent(client, gpus, runtime=_NoRuntime(), log=lambda _m: None)
        node = agent.announce()
    finally:
        client.close()
    save_config(state_dir, {"url": url, "token": token, "simulate": simulate,
                            "node": {"id": node.get("id"), "name": node.get("name")}})
    print(f"registered node {node.get('name', '?')}: {inventory.summary()}")
    return EXIT_OK


class _NoRuntime:
    """Stand-in runtime for `register`, which starts nothing."""

    name = "none"
    node = None


def _pick_runtime(args, simulate: bool, node: str | None):
    if args.runtime in ("auto", "docker"):
        try:
            return DockerRuntime(node, network_mode=args.network, simulate=simulate)
        except RuntimeFailure as exc:
            if args.runtime == "docker":
                raise CliError(str(exc)) from None
        print_line(f"no Docker Engine answers at {docker_host()}: using the local process "
                   "runtime (no isolation, images ignored)")
    return ProcessRuntime(_state_dir(args.state_dir))


def _cmd_run(args) -> int:
    config = load_config(_state_dir(args.state_dir))
    url, token = _url_and_token(args, config)
    simulate = args.simulate or config.get("simulate")
    gpus = load_gpus(simulate)
    node = (config.get("node") or {}).get("id")
    runtime = _pick_runtime(args, simulate=bool(simulate), node=None if node is None else str(node))
    client = MarketplaceClient(url, token)
    agent = Agent(client, gpus, runtime, poll_interval=args.poll_interval,
                  heartbeat_interval=args.heartbeat_interval, grace_s=args.grace)
    stop = threading.Event()

    def on_signal(signum, _frame):
        print_line(f"received {signal.Signals(signum).name}: stopping the loop; lease "
                   "workloads keep running")
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    print_line(f"gpumarket-runner {__version__}: polling {url} every {args.poll_interval:g} s "
               f"({gpus.source})")
    try:
        agent.run(stop)
    finally:
        client.close()
    return EXIT_OK


def _positive(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be > 0")
    return number


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 1 (2 is reserved
    for "no NVIDIA driver / bad dump")."""

    def error(self, message: str):
        self.exit(EXIT_ERROR, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpumarket-runner",
        description="Provider agent of gpumarket: registers this host's GPUs and runs leases.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    simulate_help = "read the GPUs from this recorded `nvidia-smi -q` dump instead of NVML"
    state_help = f"state directory (env GPUMARKET_RUNNER_STATE_DIR; default {DEFAULT_STATE_DIR})"

    reg = sub.add_parser("register", help="send this host's GPUs to the marketplace")
    reg.add_argument("--url", help="marketplace base URL (env GPUMARKET_URL)")
    reg.add_argument("--token", help="runner token of the node (env GPUMARKET_RUNNER_TOKEN)")
    reg.add_argument("--simulate", metavar="FILE", help=simulate_help)
    reg.add_argument("--state-dir", metavar="DIR", help=state_help)
    reg.set_defaults(func=_cmd_register)

    run = sub.add_parser("run", help="heartbeat and run this node's leases until stopped")
    run.add_argument("--state-dir", metavar="DIR", help=state_help)
    run.add_argument("--url", help="override the registered marketplace URL")
    run.add_argument("--token", help="override the registered runner token")
    run.add_argument("--simulate", metavar="FILE", help=simulate_help)
    run.add_argument("--poll-interval", type=_positive, default=2.0, metavar="S",
                     help="seconds between lease polls (default 2)")
    run.add_argument("--heartbeat-interval", type=_positive, default=10.0, metavar="S",
                     help="seconds between heartbeats (default 10)")
    run.add_argument("--grace", type=float, default=10.0, metavar="S",
                     help="seconds between SIGTERM and SIGKILL when stopping (default 10)")
    run.add_argument("--network", metavar="MODE", default=None,
                     help="Docker network mode of lease containers (default: engine default)")
    run.add_argument("--runtime", choices=("auto", "docker", "process"), default="auto",
                     help="auto: Docker if an engine answers, else local processes")
    run.set_defaults(func=_cmd_run)

    inv = sub.add_parser("inventory", help="print this host's GPUs; contacts nobody")
    inv.add_argument("--simulate", metavar="FILE", help=simulate_help)
    inv.add_argument("--json", action="store_true", help="print JSON (the inventory body)")
    inv.set_defaults(func=_cmd_inventory)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI with `argv` (default sys.argv[1:]); return the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CliError as exc:
        message, code = str(exc), exc.code
    except DumpError as exc:
        message, code = f"malformed nvidia-smi dump: {exc}", EXIT_NO_GPU
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
