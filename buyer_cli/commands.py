"""What each `gpumarket` command does (cli.py parses the command line): one API call or
a few, then the API's JSON (`--json`) or a human summary (render.py)."""

from __future__ import annotations

import getpass
import json
import os
import secrets
import shlex
import shutil
import socket
import sys
from pathlib import Path
from urllib.parse import quote

from . import config, render
from .api import Api
from .bidding import bid_body, sealed_bid_body
from .config import EXIT_AUTH, EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CliError
from .render import ENDED


def _follow():
    """follow.py, imported when a command follows a lease (websockets costs ~70 ms)."""
    from . import follow
    return follow


def _api(args) -> Api:
    url, token = config.server(config.load(config.config_path(args.config)), args.url)
    return Api(url, token)


def _emit(args, data, human) -> int:
    """Print `data` as JSON with --json, else `human(data)`; exit 0."""
    print(json.dumps(data, indent=2) if args.json else human(data), flush=True)
    return EXIT_OK


def _say(args):
    """Progress lines: stdout, or stderr under --json (stdout is the JSON)."""
    stream = sys.stderr if args.json else sys.stdout
    return lambda line: print(line, file=stream, flush=True)


# login / logout -----------------------------------------------------------------------

def _read_secret_line(prompt: str) -> str:
    if sys.stdin.isatty():
        return getpass.getpass(prompt)
    return sys.stdin.readline().rstrip("\r\n")


def login(args) -> int:
    path = config.config_path(args.config)
    saved = config.load(path)  # refuses a file others may read before anything is asked
    raw = args.url or os.environ.get("GPUMARKET_URL") or saved.get("url")
    if not raw:
        raise CliError("login needs --url URL (the marketplace, e.g. https://gpumarket.example)",
                       EXIT_USAGE)
    url = config.check_url(raw)
    if args.token is not None:
        token = _read_secret_line("API token: ") if args.token == "-" else args.token
        if not token.strip():
            raise CliError("login --token: no token given", EXIT_USAGE)
        api = Api(url, token.strip())
        token = token.strip()
        me = api.get("/me/")
        _, tokens = api.results("/auth/tokens/")
        current = next((t for t in tokens if t.get("current")), {})
        username, token_id, expires_at = me.get("username"), current.get("id"), \
            current.get("expires_at")
    else:
        username = args.username
        if not username:
            if sys.stdin.isatty():
                username = input("username: ").strip()
            else:
                username = sys.stdin.readline().strip()
        password = _read_secret_line("password: ")
        if not username or not password:
            raise CliError("login needs a username and a password (or --token)", EXIT_USAGE)
        api = Api(url, None)
        try:
            label = f"gpumarket CLI on {socket.gethostname()}"[:100]
            issued = api.post("/auth/token/", {"username": username, "password": password,
                                               "name": label}, auth=False)
        except CliError as exc:
            if exc.code == EXIT_REFUSED:
                exc.code = EXIT_AUTH  # wrong credentials (or locked out): an auth failure
            raise
        token, token_id, expires_at = issued["token"], issued.get("id"), issued.get("expires_at")
    api.close()
    config.save(path, {"url": url, "token": token, "token_id": token_id, "username": username,
                       "expires_at": expires_at})
    data = {"url": url, "username": username, "token_id": token_id, "expires_at": expires_at,
            "config": str(path)}
    return _emit(args, data, lambda d: f"logged in to {url} as {username}; the token is saved "
                 f"in {path} (mode 0600, expires {expires_at or '?'})")


def logout(args) -> int:
    path = config.config_path(args.config)
    saved = config.load(path)
    if not saved.get("token"):
        return _emit(args, {"revoked": False, "config": str(path)},
                     lambda d: f"not logged in ({path} holds no token)")
    revoked, why = False, None
    if saved.get("token_id") is not None:
        api = Api(saved["url"], saved["token"])
        try:
            api.delete(f"/auth/tokens/{int(saved['token_id'])}/")
            revoked = True
        except CliError as exc:
            if exc.code == EXIT_AUTH or "no API token" in str(exc):
                revoked = True  # already refused there: expired or revoked
            else:
                why = exc
        finally:
            api.close()
    kept = {k: v for k, v in saved.items() if k not in ("token", "token_id", "expires_at")}
    config.save(path, kept)
    if why is not None:
        raise CliError(f"the token was removed from {path} but not revoked on the server "
                       f"({why}); revoke it in the account's token list", why.code)
    return _emit(args, {"revoked": revoked, "config": str(path)},
                 lambda d: f"logged out of {saved['url']}: the token is revoked and removed "
                 f"from {path}")


# the market ---------------------------------------------------------------------------

def markets(args) -> int:
    data, items = _api(args).results("/gpu-classes/", auth=False)
    return _emit(args, data, lambda d: render.markets(items))


def book(args) -> int:
    data = _api(args).get(f"/gpu-classes/{quote(args.gpu_class, safe='')}/book/", auth=False)
    return _emit(args, data, render.book)


def templates(args) -> int:
    data, items = _api(args).results("/templates/", auth=False, limit=None)
    return _emit(args, data, lambda d: render.templates(items))


def auctions(args) -> int:
    data, items = _api(args).results("/auctions/", auth=False)
    if args.open:
        items = [a for a in items if a.get("status") == "open"]
    return _emit(args, {**data, "results": items} if args.open else data,
                 lambda d: render.auctions(items))


def bid(args) -> int:
    api = _api(args)
    data = api.post("/orders/", bid_body(args))
    # the human line names each lease's own price (the fill's); a few GETs, not with --json
    leases = [] if args.json else [api.get(f"/leases/{int(i)}/")
                                   for i in (data.get("leases") or [])[:8]]
    return _emit(args, data, lambda o: render.order_placed(o, leases))


def sealed_bid(args) -> int:
    data = _api(args).post(f"/auctions/{args.auction}/bids/", sealed_bid_body(args))
    return _emit(args, data, render.sealed_bid)


def orders(args) -> int:
    params = {"status": args.status} if args.status else {}
    data, items = _api(args).results("/orders/", params=params)
    return _emit(args, data, lambda d: render.orders(items))


def sealed_bids(args) -> int:
    data, items = _api(args).results("/sealed-bids/")
    return _emit(args, data, lambda d: "\n".join(render.sealed_bid(b) for b in items)
                 or "(none)")


def cancel(args) -> int:
    data = _api(args).post(f"/orders/{args.order}/cancel/")
    return _emit(args, data, lambda o: f"order {o.get('id')}: {o.get('status')}")


def wallet(args) -> int:
    return _emit(args, _api(args).get("/wallet/"), render.wallet)


# leases -------------------------------------------------------------------------------

def leases(args) -> int:
    data, items = _api(args).results("/leases/")
    return _emit(args, data, lambda d: render.leases(items))


def lease(args) -> int:
    return _emit(args, _api(args).get(f"/leases/{args.lease}/"), render.lease)


def wait(args) -> int:
    found = _follow().wait_running(_api(args), args.lease, timeout=args.timeout,
                                interval=args.interval, say=_say(args))
    return _emit(args, found, lambda le: "\n".join(render.connect_lines(le))
                 or f"lease {le.get('id')} is running")


def ssh(args) -> int:
    found = _api(args).get(f"/leases/{args.lease}/")
    command = (found.get("connect") or {}).get("ssh")
    if not command:
        status = found.get("status")
        why = (f"it is {status}: `gpumarket wait {args.lease}` first"
               if status in ("pending", "starting") else
               f"it has ended ({status})" if status in ENDED else
               "it was not bid with --ssh (or a template with an SSH port)"
               if found.get("port_roles") is not None or "connect" in found else
               "this server gives no `connect` commands")
        raise CliError(f"lease {args.lease} has no SSH command: {why}", EXIT_REFUSED)
    argv = shlex.split(command)
    if not argv or Path(argv[0]).name != "ssh":
        raise CliError(f"lease {args.lease}: the server's SSH command does not start with "
                       "`ssh`; not running it", EXIT_REFUSED)
    argv = ["ssh", *argv[1:], *args.extra]  # what followed `--` (cli.main)
    if args.json:
        return _emit(args, {"lease": args.lease, "argv": argv}, str)
    program = shutil.which("ssh")
    if program is None:
        raise CliError("no `ssh` program on PATH: install an OpenSSH client", EXIT_REFUSED)
    sys.stdout.flush()
    os.execv(program, argv)  # noqa: S606 - the lease's own ssh command, no shell
    return EXIT_OK  # not reached


def logs(args) -> int:
    api = _api(args)
    if not args.follow:
        return _emit(args, api.get(f"/leases/{args.lease}/logs/"),
                     lambda b: (b.get("tail") or "").rstrip("\n") or "(no output yet)")

    def out(lines: list[str], body: dict) -> None:
        if args.json:
            print(json.dumps({"lease": args.lease, "lines": lines,
                              "updated_at": body.get("updated_at")}), flush=True)
        else:
            print("\n".join(lines), flush=True)

    try:
        follow = _follow()
        ended = follow.follow_logs(api, args.lease, interval=args.interval, out=out)
    except KeyboardInterrupt:
        return EXIT_OK
    _say(args)(follow.progress_line(ended))
    return EXIT_OK


def metrics(args) -> int:
    return _emit(args, _api(args).get(f"/leases/{args.lease}/metrics/?range={args.range_}"),
                 render.metrics)


def stop(args) -> int:
    data = _api(args).post(f"/leases/{args.lease}/stop/")
    return _emit(args, data, lambda le: f"lease {le.get('id')}: {le.get('status')}; cost "
                 f"{render.shown(le.get('cost'))}")


def extend(args) -> int:
    body = {"hours": args.hours} if args.hours is not None else {"seconds": args.seconds}
    # An idempotency key: the one retry after a timeout can never extend twice.
    body["request_id"] = args.request_id or f"cli-{secrets.token_hex(12)}"
    data = _api(args).post(f"/leases/{args.lease}/extend/", body, retry_timeout=True)
    return _emit(args, data, lambda le: f"lease {le.get('id')}: {le.get('status')}, now ends "
                 f"{le.get('ends_at')}")


# SSH keys ---------------------------------------------------------------------------

def ssh_keys_list(args) -> int:
    data, items = _api(args).results("/ssh-keys/", limit=None)
    return _emit(args, data, lambda d: render.ssh_keys(items))


def ssh_keys_add(args) -> int:
    path = Path(args.file).expanduser()
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
                       EXIT_USAGE) from None
    if "PRIVATE KEY" in text:
        raise CliError(f"{path} is a private key: give the public one ({path}.pub)",
                       EXIT_USAGE)
    fields = text.split()
    name = args.name or (" ".join(fields[2:]) if len(fields) > 2 else path.name)
    data = _api(args).post("/ssh-keys/", {"name": name[:100], "public_key": text})
    return _emit(args, data, lambda k: f"SSH key {k.get('id')} added: {k.get('name')} "
                 f"{k.get('type')} {k.get('fingerprint')}")


def ssh_keys_delete(args) -> int:
    _api(args).delete(f"/ssh-keys/{args.key}/")
    return _emit(args, {"id": args.key, "deleted": True},
                 lambda d: f"SSH key {args.key} deleted")
