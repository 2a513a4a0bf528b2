"""The CLI's config file and exit statuses.

The file: `--config PATH`, else $GPUMARKET_CONFIG, else
$XDG_CONFIG_HOME/gpumarket/config.json (XDG_CONFIG_HOME defaults to ~/.config). JSON
{"url", "token", "token_id", "username", "expires_at"}, written 0600 in a 0700 folder; an
existing file that other users may read is refused (the token would be theirs too).
$GPUMARKET_URL and $GPUMARKET_TOKEN override the file's url and token.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_AUTH, EXIT_UNREACHABLE = 0, 1, 2, 3, 4


class CliError(Exception):
    """A failure shown as one line on stderr; `code` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.code = code


def config_path(flag: str | None, environ=os.environ) -> Path:
    """Where the config file is: --config, $GPUMARKET_CONFIG, the XDG default."""
    raw = flag or environ.get("GPUMARKET_CONFIG")
    if raw:
        return Path(raw).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or "~/.config"
    return Path(base).expanduser() / "gpumarket" / "config.json"


def load(path: Path) -> dict:
    """The config ({} when there is none). CliError (exit 3) when others may read it,
    or when it is not a JSON object."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", EXIT_AUTH) from None
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise CliError(f"{path} is readable by other users (mode {mode:04o}): refusing to "
                       f"use the token in it; `chmod 600 {path}`, and revoke the token "
                       "(`gpumarket logout`) if someone else could read it", EXIT_AUTH)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {path}: {exc}", EXIT_AUTH) from None
    if not isinstance(data, dict):
        raise CliError(f"{path} is not a JSON object: log in again", EXIT_AUTH)
    return data


def save(path: Path, config: dict) -> None:
    """Write `config` readable by its owner only (0600, folder 0700), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(config, out, indent=2)
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def server(config: dict, url_flag: str | None = None, environ=os.environ
           ) -> tuple[str, str | None]:
    """(base URL, token or None): --url, else $GPUMARKET_URL, else the config's; the token
    from $GPUMARKET_TOKEN, else the config's (only with the URL it was issued by).
    CliError (exit 3) when no URL is known at all."""
    url = url_flag or environ.get("GPUMARKET_URL") or config.get("url")
    if not url:
        raise CliError("not logged in: run `gpumarket login --url https://MARKETPLACE` first",
                       EXIT_AUTH)
    url = url.rstrip("/")
    token = environ.get("GPUMARKET_TOKEN") or (
        config.get("token") if (config.get("url") or "").rstrip("/") == url else None)
    return url, token


def check_url(url: str) -> str:
    """`url` without a trailing slash; CliError (exit 2) unless http(s)://host."""
    if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1]) == 0:
        raise CliError(f"--url {url!r} must start with http:// or https://", EXIT_USAGE)
    return url.rstrip("/")
