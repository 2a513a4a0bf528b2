"""`gpumarket`: the buyer's command line (docs/CLI.md: commands, config file, exit codes).

Exit statuses (config.py): 0 ok, 1 the API refused (its `detail` and field errors in one
line), 2 usage, 3 not logged in or the token refused, 4 the server cannot be reached or
failed. Every error is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from . import __version__, commands
from .config import EXIT_REFUSED, EXIT_USAGE, CliError
from .money import parse_usd


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (exit 2), naming the command's --help."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"gpumarket: {message} (see `{self.prog} --help`)\n")


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of at least 1")
    return int(value)


def _price(value: str) -> str:
    """A price in USD per GPU-hour, sent as typed ("2.49"); checked here so a typo is a
    usage error, and by the server again."""
    try:
        micros = parse_usd(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if micros <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be more than 0")
    return value.strip()


def _seconds(value: str) -> float:
    try:
        number = float(value)  # a timeout, not money
    except ValueError:
        number = -1.0
    if not 0 < number < 10**7:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds above 0")
    return number


def _workload_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--price", type=_price, required=True, metavar="USD",
                   help="limit price in USD per GPU-hour, e.g. 2.49 (at most 6 decimals)")
    p.add_argument("--template", metavar="ID", help="an environment template "
                   "(`gpumarket templates`); sets image, command, ports and min CUDA")
    p.add_argument("--image", metavar="IMAGE", help="your own image, name[:tag][@digest]")
    p.add_argument("--command", metavar="CMD", help="the container's command, one string "
                   "split like a shell would (no shell runs it)")
    p.add_argument("--port", type=_positive, action="append", metavar="PORT",
                   help="a container TCP port to publish (repeatable)")
    p.add_argument("--ssh", action="store_true", help="put your SSH keys in the lease and "
                   "publish port 22 (`gpumarket ssh-keys add`)")
    p.add_argument("--env", action="append", metavar="NAME=VALUE",
                   help="an environment variable (repeatable; not secret)")
    p.add_argument("--secret", action="append", metavar="NAME=VALUE|NAME=@FILE",
                   help="a secret environment variable (repeatable): sent once, never shown "
                   "again; @FILE reads the value from a file")
    p.add_argument("--min-cuda", metavar="X.Y", help="only nodes whose driver supports CUDA "
                   "X.Y or later")
    _terms_options(p)


def _whole(value: str) -> int:
    if not value.isascii() or not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of at least 0")
    return int(value)


def _terms_options(p: argparse.ArgumentParser) -> None:
    """The stop, failover and checkpoint terms (bidding._terms); the server checks them."""
    p.add_argument("--notice-signal", metavar="SIG", help="sent to the workload with a "
                   "notice (preemption, maintenance, the end): SIGUSR1, SIGUSR2, SIGINT, "
                   "SIGHUP or SIGTERM (default: none, the notice file only)")
    p.add_argument("--stop-grace", type=_whole, metavar="S", help="seconds from SIGTERM to "
                   "SIGKILL when the lease stops, 0-300 (default 10)")
    p.add_argument("--no-failover", action="store_true", help="a lease failed by the "
                   "provider's side just ends (default: it continues on another node)")
    p.add_argument("--min-reliability", metavar="R", help="only nodes at least this "
                   "reliable over 30 days, 0-1, e.g. 0.95 (new nodes qualify)")
    p.add_argument("--checkpoint-url", metavar="s3://BUCKET/PREFIX", help="upload "
                   "/workspace/checkpoint there before the lease stops (docs/CHECKPOINTS.md)")
    p.add_argument("--checkpoint-endpoint", metavar="URL", help="an S3-compatible store's "
                   "http(s)://host:port (default: AWS S3)")
    p.add_argument("--checkpoint-region", metavar="REGION")
    p.add_argument("--checkpoint-key-id", metavar="ID", help="the store's access key ID")
    p.add_argument("--checkpoint-secret-key-file", metavar="FILE", help="a file holding "
                   "the store's secret access key (default: $GPUMARKET_CHECKPOINT_SECRET_KEY;"
                   " never on the command line)")


def _common(p: argparse.ArgumentParser, *, top: bool = False) -> None:
    keep = {} if top else {"default": argparse.SUPPRESS}  # a subcommand's flag wins
    p.add_argument("--json", action="store_true", help="print the API's JSON", **keep)
    p.add_argument("--config", metavar="PATH", help="the config file (default "
                   "$GPUMARKET_CONFIG or $XDG_CONFIG_HOME/gpumarket/config.json)", **keep)
    p.add_argument("--url", metavar="URL", help="the marketplace (default: the one logged "
                   "in to, or $GPUMARKET_URL)", **keep)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpumarket", description="Rent GPUs on a gpumarket marketplace: "
                     "bid, wait for the lease, connect, stop. Details: docs/CLI.md.")
    parser.add_argument("--version", action="version", version=f"gpumarket {__version__}")
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=_Parser)

    def command(name: str, func, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        _common(p)
        p.set_defaults(func=func)
        return p

    p = command("login", commands.login, "log in and save an API token (0600)")
    p.add_argument("--token", metavar="TOKEN", help="an API token you have ('-': read it "
                   "from stdin); default: ask for a username and password")
    p.add_argument("--username", metavar="NAME", help="default: asked")
    command("logout", commands.logout, "revoke the saved token and forget it")
    command("markets", commands.markets, "the GPU classes (one market each)")
    p = command("book", commands.book, "the order book of a GPU class")
    p.add_argument("gpu_class", metavar="CLASS")
    command("templates", commands.templates, "the environment templates")
    p = command("auctions", commands.auctions, "sealed-bid auctions, newest first")
    p.add_argument("--open", action="store_true", help="only the open ones")

    p = command("bid", commands.bid, "place a bid on a GPU class's order book")
    p.add_argument("gpu_class", metavar="CLASS")
    p.add_argument("--gpus", type=_positive, required=True, metavar="N")
    p.add_argument("--hours", type=_positive, required=True, metavar="H")
    _workload_options(p)
    p.add_argument("--gang-size", type=_positive, metavar="N",
                   help="GPUs per node (default: all on one node)")
    p.add_argument("--time-in-force", choices=("GTC", "IOC", "FOK"))
    p.add_argument("--interruptible", action="store_true",
                   help="cheaper GPUs a higher bid may preempt after a notice")
    p.add_argument("--node", type=_positive, metavar="NODE",
                   help="fill only on this node (a node id of the offers)")
    p.add_argument("--prefer-cached-image", action="store_true",
                   help="among offers at the same price, nodes that hold the image already "
                   "first (a faster start; never a higher price)")
    p.add_argument("--client-order-id", metavar="ID",
                   help="your id: placing it again returns the first order")

    p = command("sealed-bid", commands.sealed_bid, "place a sealed bid on an auction")
    p.add_argument("auction", type=_positive, metavar="AUCTION")
    p.add_argument("--gpus", type=_positive, metavar="N", help="default: the whole lot")
    p.add_argument("--min-gpus", type=_positive, metavar="N")
    _workload_options(p)
    command("sealed-bids", commands.sealed_bids, "your sealed bids")

    p = command("orders", commands.orders, "your orders, newest first")
    p.add_argument("--status", metavar="S[,S]", help="e.g. open,partially_filled")
    p = command("cancel", commands.cancel, "cancel an order (its hold is released)")
    p.add_argument("order", type=_positive, metavar="ORDER")
    command("wallet", commands.wallet, "your balances and holds")

    command("leases", commands.leases, "your leases, newest first")
    for name, func, help_ in (("lease", commands.lease, "one lease, with how to connect"),
                              ("stop", commands.stop, "end a lease now (you pay the seconds "
                               "used)")):
        command(name, func, help_).add_argument("lease", type=_positive, metavar="LEASE")
    p = command("wait", commands.wait, "wait until a lease runs (exit 1 if it ends first)")
    p.add_argument("lease", type=_positive, metavar="LEASE")
    p.add_argument("--timeout", type=_seconds, default=900.0, metavar="S",
                   help="give up after S seconds (default 900)")
    p.add_argument("--interval", type=_seconds, default=2.0, metavar="S",
                   help="seconds between polls when the live feed is down (default 2)")
    p = command("ssh", commands.ssh, "SSH into a lease (runs its `ssh` command; what follows "
                "-- is appended: ssh options or a remote command)")
    p.usage = "gpumarket ssh [-h] [--json] [--config PATH] [--url URL] LEASE [-- ARGS…]"
    p.add_argument("lease", type=_positive, metavar="LEASE")
    p = command("logs", commands.logs, "the lease container's latest output")
    p.add_argument("lease", type=_positive, metavar="LEASE")
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep printing new lines until the lease ends")
    p.add_argument("--interval", type=_seconds, default=2.0, metavar="S",
                   help="seconds between reads of the tail (default 2)")
    p = command("metrics", commands.metrics, "a lease's GPU telemetry: the latest reading "
                "and the range's utilisation per GPU, and whether it is idle")
    p.add_argument("lease", type=_positive, metavar="LEASE")
    p.add_argument("--range", choices=["1h", "24h"], default="1h", dest="range_",
                   help="1h: 10 s buckets (default); 24h: 1 min buckets")
    p = command("extend", commands.extend, "run a lease longer, at its price")
    p.add_argument("lease", type=_positive, metavar="LEASE")
    more = p.add_mutually_exclusive_group(required=True)
    more.add_argument("--hours", type=_positive, metavar="N")
    more.add_argument("--seconds", type=_positive, metavar="N")
    p.add_argument("--request-id", metavar="KEY", default=None,
                   help="idempotency key (1-64 of A-Z a-z 0-9 . _ : -); the same key "
                        "never extends twice (default: a new one, reused on a retry)")

    keys = command("ssh-keys", None, "your SSH public keys")
    ops = keys.add_subparsers(dest="op", metavar="list|add|delete", required=True,
                              parser_class=_Parser)
    for name, func, help_ in (("list", commands.ssh_keys_list, "list them"),
                              ("add", commands.ssh_keys_add, "add a public key file"),
                              ("delete", commands.ssh_keys_delete, "delete one")):
        op = ops.add_parser(name, help=help_, description=help_)
        _common(op)
        op.set_defaults(func=func)
        if name == "add":
            op.add_argument("file", metavar="FILE", help="e.g. ~/.ssh/id_ed25519.pub")
            op.add_argument("--name", help="default: the key's comment")
        elif name == "delete":
            op.add_argument("key", type=_positive, metavar="ID")
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line; for `ssh LEASE [options] -- ARGS…`, `extra` is ARGS as
    given (argparse alone cannot take options between LEASE and `--`). Exit 2 on a usage
    error."""
    parser, extra = build_parser(), []
    args = None
    if "--" in argv and "ssh" in argv[:argv.index("--")]:
        cut = argv.index("--")
        args = parser.parse_args(argv[:cut])
        if args.command == "ssh":
            extra = argv[cut + 1:]
        else:
            args = None
    args = args or parser.parse_args(argv)
    args.extra = extra
    return args


def main(argv: list[str] | None = None) -> int:
    """Run `gpumarket` with `argv` (default sys.argv[1:]); return the exit status."""
    args = parse(sys.argv[1:] if argv is None else list(argv))
    try:
        return args.func(args)
    except CliError as exc:
        message, code = str(exc), exc.code
    except KeyboardInterrupt:
        message, code = "interrupted", EXIT_REFUSED
    except BrokenPipeError:
        return EXIT_REFUSED
    except Exception as exc:  # last resort: one line, never a traceback
        message, code = f"unexpected error: {exc.__class__.__name__}: {exc}", EXIT_REFUSED
    print(f"gpumarket: {message}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
