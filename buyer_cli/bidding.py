"""The JSON bodies of a bid (POST /api/v1/orders/) and a sealed bid (POST
/api/v1/auctions/<id>/bids/) from the command line's options; the fields of issue 12's
contract (template, ssh, env, secrets, min_cuda) included. The server checks every value
again and names the field it refuses; here only what cannot be sent at all (a NAME=VALUE
without "=", a file that cannot be read) is a usage error."""

from __future__ import annotations

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
            value = _secret_file(name, value[1:], option)
        out[name] = value
    return out


def _nth(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _secret_file(name: str, path: str, option: str) -> str:
    file = Path(path).expanduser()
    try:
        if file.stat().st_size > SECRET_FILE_MAX:
            raise CliError(f"{option} {name}=@{path}: the file is larger than "
                           f"{SECRET_FILE_MAX} bytes", EXIT_USAGE)
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise CliError(f"{option} {name}=@{path}: the file is not UTF-8 text",
                       EXIT_USAGE) from None
    except OSError as exc:
        raise CliError(f"{option} {name}=@{path}: cannot read the file ({exc.strerror})",
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
    if not args.template and not args.image:
        raise CliError("give --template ID (see `gpumarket templates`) or --image IMAGE",
                       EXIT_USAGE)
    return body


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
