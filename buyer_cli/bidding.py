"""The JSON bodies of a bid (POST /api/v1/orders/) and a sealed bid (POST
/api/v1/auctions/<id>/bids/) from the command line's options; the fields of issue 12's
contract (template, ssh, env, secrets, min_cuda) included. The server checks every value
again and names the field it refuses; here only what cannot be sent at all (a NAME=VALUE
without "=", a file that cannot be read) is a usage error."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from .config import EXIT_USAGE, CliError

SECRET_FILE_MAX = 1024 * 1024  # a larger file is surely not meant; the server bounds it too


def pairs(values: list[str] | None, option: str, *, files: bool = False) -> dict[str, str]:
    """["NAME=VALUE", …] → {NAME: VALUE}; with `files`, "NAME=@path" takes the file's text
    (UTF-8, one trailing newline dropped). CliError (exit 2) naming the option — never the
    value, which may be a secret."""
    out: dict[str, str] = {}
    for number, raw in enumerate(values or [], 1):
        name, sep, value = raw.partition("=")
        if not sep or not name:  # the text is not shown: it may be a secret's value
            raise CliError(f"{option} (the {_nth(number)} one) is not NAME=VALUE"
                           + (" or NAME=@FILE" if files else ""), EXIT_USAGE)
        if name in out:
            raise CliError(f"{option} {name} is given twice", EXIT_USAGE)
        if files and value.startswith("@"):
            value = _secret_file(value[1:], f"{option} {name}=@{value[1:]}")
        out[name] = value
    return out


def _nth(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _secret_file(path: str, what: str) -> str:
    """The file's UTF-8 text, one trailing newline dropped; CliError naming `what`."""
    file = Path(path).expanduser()
    try:
        if file.stat().st_size > SECRET_FILE_MAX:
            raise CliError(f"{what}: the file is larger than "
                           f"{SECRET_FILE_MAX} bytes", EXIT_USAGE)
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise CliError(f"{what}: the file is not UTF-8 text",
                       EXIT_USAGE) from None
    except OSError as exc:
        raise CliError(f"{what}: cannot read the file ({exc.strerror})",
                       EXIT_USAGE) from None
    return text[:-1] if text.endswith("\n") else text


def _workload(args) -> dict:
    """The fields a bid and a sealed bid share: what runs in the lease."""
    body: dict = {}
    if args.template:
        body["template"] = args.template
    if args.image:
        body["image"] = args.image
    if args.command is not None:
        try:
            body["command"] = shlex.split(args.command)
        except ValueError as exc:
            raise CliError(f"--command: {exc}", EXIT_USAGE) from None
    if args.port:
        body["ports"] = args.port
    if args.ssh:
        body["ssh"] = True
    env = pairs(args.env, "--env")
    if env:
        body["env"] = env
    secrets = pairs(args.secret, "--secret", files=True)
    if secrets:
        body["secrets"] = secrets
    if args.min_cuda:
        body["min_cuda"] = args.min_cuda
    body.update(_terms(args))
    if not args.template and not args.image:
        raise CliError("give --template ID (see `gpumarket templates`) or --image IMAGE",
                       EXIT_USAGE)
    return body


CHECKPOINT_SECRET_ENV = "GPUMARKET_CHECKPOINT_SECRET_KEY"


def _terms(args) -> dict:
    """The stop, failover and checkpoint terms (docs/LEASE_CONTRACT.md, docs/FAULTS.md,
    docs/CHECKPOINTS.md) of a bid and a sealed bid, as given (the server checks them)."""
    body: dict = {}
    if args.notice_signal is not None:
        body["notice_signal"] = args.notice_signal
    if args.stop_grace is not None:
        body["stop_grace_seconds"] = args.stop_grace
    if args.no_failover:
        body["failover"] = False
    if args.min_reliability is not None:
        body["min_reliability"] = args.min_reliability
    checkpoint = _checkpoint(args)
    if checkpoint:
        body["checkpoint"] = checkpoint
    return body


def _checkpoint(args) -> dict | None:
    """The `checkpoint` object: the secret access key from --checkpoint-secret-key-file
    or $GPUMARKET_CHECKPOINT_SECRET_KEY, never the command line (argv is visible to every
    user of the machine)."""
    given = {"endpoint_url": args.checkpoint_endpoint, "region": args.checkpoint_region,
             "access_key_id": args.checkpoint_key_id}
    given = {k: v for k, v in given.items() if v is not None}
    if args.checkpoint_url is None:
        if given or args.checkpoint_secret_key_file:
            raise CliError("the --checkpoint-… options need --checkpoint-url s3://BUCKET/"
                           "PREFIX", EXIT_USAGE)
        return None
    if args.checkpoint_secret_key_file:
        secret = _secret_file(args.checkpoint_secret_key_file, "--checkpoint-secret-key-file "
                              f"{args.checkpoint_secret_key_file}")
    elif os.environ.get(CHECKPOINT_SECRET_ENV):
        secret = os.environ[CHECKPOINT_SECRET_ENV]
    else:
        raise CliError("--checkpoint-url needs the store's secret key: "
                       f"--checkpoint-secret-key-file FILE or ${CHECKPOINT_SECRET_ENV}",
                       EXIT_USAGE)
    return {"url": args.checkpoint_url, **given, "secret_access_key": secret}


def bid_body(args) -> dict:
    """POST /api/v1/orders/: a bid of args.gpus GPUs of args.gpu_class for args.hours at
    args.price (USD per GPU-hour, the string as typed)."""
    body = {"side": "bid", "gpu_class": args.gpu_class, "price": args.price,
            "gpus": args.gpus, "hours": args.hours, **_workload(args)}
    if args.gang_size:
        body["gang_size"] = args.gang_size
    if args.time_in_force:
        body["time_in_force"] = args.time_in_force
    if args.interruptible:
        body["interruptible"] = True
    if args.node:
        body["node"] = args.node
    if args.prefer_cached_image:
        body["prefer_cached_image"] = True
    if args.client_order_id:
        body["client_order_id"] = args.client_order_id
    return body


def sealed_bid_body(args) -> dict:
    """POST /api/v1/auctions/<id>/bids/: price, gpus, min_gpus and the workload."""
    body = {"price": args.price, **_workload(args)}
    if args.gpus:
        body["gpus"] = args.gpus
    if args.min_gpus:
        body["min_gpus"] = args.min_gpus
    return body
