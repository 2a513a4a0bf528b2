"""The runner's configuration: state dir, config.json, marketplace URL and token, limits.

Each value comes from its flag, else its environment variable, else the state dir's
config.json (written 0600 by `register`), else a default; a bad value is a CliError naming
where it came from. The sources in order: docs/RUNNER.md ("Commands").
"""

from __future__ import annotations

import json
import math
import os
import uuid
from pathlib import Path

from .limits import ResourcePolicy, parse_size

EXIT_OK, EXIT_ERROR, EXIT_NO_GPU, EXIT_UNAUTHORIZED = 0, 1, 2, 3
DEFAULT_STATE_DIR = "~/.gpumarket-runner"


class CliError(Exception):
    """A failure to show as one line on stderr; `code` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def state_dir_from(value: str | None) -> Path:
    """The state dir: `value` (--state-dir), else GPUMARKET_RUNNER_STATE_DIR, else
    DEFAULT_STATE_DIR; `~` expanded."""
    raw = value or os.environ.get("GPUMARKET_RUNNER_STATE_DIR") or DEFAULT_STATE_DIR
    return Path(raw).expanduser()


def simulate_id(state_dir: Path) -> str:
    """This state dir's id (a UUID in its file `simulate-id`, made on first use, 0600):
    what `--simulate` derives a scrubbed recording's UUIDs from (sim_uuids). CliError when
    the state dir cannot be written."""
    path = state_dir / "simulate-id"
    try:
        if not path.is_file():
            state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(f"{uuid.uuid4()}\n")
        return path.read_text().strip()
    except FileExistsError:
        return path.read_text().strip()
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror or exc}") from None


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


def marketplace_from(url: str | None, token: str | None, config: dict
                     ) -> tuple[str | None, str | None]:
    """(url, token) of the marketplace: each from its flag value (None: not given), else
    GPUMARKET_URL / GPUMARKET_RUNNER_TOKEN, else config.json; None where nothing sets it."""
    return (url or os.environ.get("GPUMARKET_URL") or config.get("url"),
            token or os.environ.get("GPUMARKET_RUNNER_TOKEN") or config.get("token"))


def token_source(token: str | None) -> str | None:
    """Where marketplace_from took the token from when not config.json: "--token" (the
    flag value `token` is set) or "GPUMARKET_RUNNER_TOKEN"; None otherwise."""
    return ("--token" if token else "GPUMARKET_RUNNER_TOKEN"
            if os.environ.get("GPUMARKET_RUNNER_TOKEN") else None)


def require_marketplace(url: str | None, token: str | None, config: dict) -> tuple[str, str]:
    """marketplace_from, both required: CliError naming what is missing, or a URL that is
    not http(s)."""
    url, token = marketplace_from(url, token, config)
    if not url or not token:
        missing = [n for n, v in (("--url", url), ("--token", token)) if not v]
        them = "them" if len(missing) == 2 else "it"
        raise CliError(f"missing {' and '.join(missing)}: pass {them} on the command line, set "
                       "GPUMARKET_URL / GPUMARKET_RUNNER_TOKEN, or run "
                       "`gpumarket-runner register` first")
    if not url.startswith(("http://", "https://")):
        raise CliError(f"invalid --url {url!r}: it must start with http:// or https://")
    return url, token


MAX_PIDS_LIMIT = 4_194_304  # PID_MAX_LIMIT of 64-bit Linux: more pids cannot exist
LIMIT_SOURCES = (  # (ResourcePolicy field, --flag / args attribute, environment variable)
    ("memory_per_gpu", "memory_per_gpu", "GPUMARKET_RUNNER_MEMORY_PER_GPU"),
    ("cpus_per_gpu", "cpus_per_gpu", "GPUMARKET_RUNNER_CPUS_PER_GPU"),
    ("pids_limit", "pids_limit", "GPUMARKET_RUNNER_PIDS_LIMIT"),
    ("shm_size", "shm_size", "GPUMARKET_RUNNER_SHM_SIZE"),
)


def resource_policy(args, config: dict, environ=os.environ) -> ResourcePolicy:
    """The lease container limits from flags, else environment, else config.json's
    "limits", else the default rule (limits.py). CliError naming the flag, variable or key
    of a value that is not a positive size or number."""
    from_config = config.get("limits") or {}
    if not isinstance(from_config, dict):
        raise CliError('config.json: "limits" must be an object')
    values = {}
    for field, attr, variable in LIMIT_SOURCES:
        flag = "--" + attr.replace("_", "-")
        for source, raw in ((flag, getattr(args, attr, None)), (variable, environ.get(variable)),
                            (f'config.json "limits.{field}"', from_config.get(field))):
            if raw is None or raw == "":
                continue
            try:
                if isinstance(raw, bool):  # JSON true/false is not 1/0
                    raise ValueError(f"{raw!r} is not a number")
                if field in ("memory_per_gpu", "shm_size"):
                    values[field] = parse_size(raw)
                elif field == "cpus_per_gpu":
                    values[field] = float(raw)
                    if not math.isfinite(values[field]):
                        raise ValueError(f"{raw!r} is not a finite number")
                else:
                    values[field] = int(raw)
                    if str(raw).strip() != str(values[field]):
                        raise ValueError(f"{raw!r} is not a whole number")
                    if values[field] > MAX_PIDS_LIMIT:
                        raise ValueError(f"{raw!r} must be at most {MAX_PIDS_LIMIT} (the "
                                         "kernel's largest pid_max)")
                if values[field] <= 0:
                    raise ValueError(f"{raw!r} must be more than 0")
            except (TypeError, ValueError, OverflowError) as exc:
                ours = str(exc).startswith(repr(raw))  # not float()'s or int()'s wording
                reason = str(exc) if ours else f"{raw!r} is not a number"
                raise CliError(f"{source}: {reason}") from None
            break
    return ResourcePolicy(**values)


def node_label(node: dict) -> str | None:
    """The `gpumarket.node` container label: the node's uid (unique across marketplace
    databases), else its id from an older registration."""
    value = node.get("uid") or node.get("id")
    return None if value is None else str(value)

