"""A bid's checkpoint store (issue 15): an S3-compatible bucket its leases' runner uploads
the workload's checkpoint to, and restores it from when a lease continues a chain.
docs/CHECKPOINTS.md.

- `clean(data)` checks the bid's `checkpoint` object (shape and bounds, no network) into a
  `Checkpoint`: `terms` (stored in clear, shown back) and `credentials` (sealed apart with
  sealing.py, never shown: `Checkpoint.__repr__` leaves them out).
- `probe(cp)` asks the bucket (boto3 head_bucket and a one-key listing; 3 s connect/read,
  no retry) and refuses what no runner could use; endpoints on private or loopback
  addresses are refused unless settings.GPUMARKET_CHECKPOINT_ALLOW_PRIVATE (the
  marketplace is no SSRF probe).
- `public(terms)` the API's view; `runner_payload(lease)` what its runner gets.
Every refusal is InvalidInput naming `checkpoint` (or `checkpoint.<key>`), never a secret.
"""

from __future__ import annotations

import ipaddress
import posixpath
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.conf import settings

from core.text import bad_character_message
from marketplace.errors import InvalidInput
from marketplace.sealing import seal, unseal

FIELD = "checkpoint"
WORKSPACE = "/workspace"  # where the runner mounts the lease's workspace
DEFAULT_PATH = "/workspace/checkpoint"
DEFAULT_MAX_BYTES = 10 * 1024**3  # 10 GiB
MAX_MAX_BYTES = 1024**4  # 1 TiB: the largest bound a bid may name
PROBE_TIMEOUT_S = 3
KEYS = ("url", "endpoint_url", "access_key_id", "secret_access_key", "region", "path",
        "max_bytes")
CREDENTIALS = ("access_key_id", "secret_access_key")


@dataclass(frozen=True)
class Checkpoint:
    """terms: {url, endpoint_url, region, path, max_bytes} (url "s3://bucket/prefix");
    credentials: {access_key_id, secret_access_key} in clear (never in a repr)."""

    terms: dict
    credentials: dict = field(repr=False)

    @property
    def bucket(self) -> str:
        return urlsplit(self.terms["url"]).netloc

    def sealed(self) -> str:
        """The credentials sealed for the Order/SealedBid/Lease `checkpoint_sealed`."""
        return seal(self.credentials)


def _text(data: dict, key: str, *, max_length: int, required: bool = False) -> str:
    value = data.get(key, "")
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise InvalidInput("must be a string", field=f"{FIELD}.{key}")
    if required and not value:
        raise InvalidInput("is required", field=f"{FIELD}.{key}")
    if len(value) > max_length:
        raise InvalidInput(f"must be at most {max_length} characters", field=f"{FIELD}.{key}")
    bad = bad_character_message(value)
    if bad is not None:
        raise InvalidInput(bad, field=f"{FIELD}.{key}")
    return value


def _bucket_url(url: str) -> str:
    parts = urlsplit(url)
    bucket = parts.netloc
    if parts.scheme != "s3" or not bucket or parts.query or parts.fragment:
        raise InvalidInput('must be "s3://bucket" or "s3://bucket/prefix"', field=f"{FIELD}.url")
    if not (3 <= len(bucket) <= 63) or not all(c.isalnum() or c in ".-" for c in bucket) \
            or bucket != bucket.lower():
        raise InvalidInput("names no valid bucket (3 to 63 lowercase letters, digits, '.' "
                           "and '-')", field=f"{FIELD}.url")
    prefix = parts.path.strip("/")
    if ".." in prefix.split("/"):
        raise InvalidInput("must not contain '..'", field=f"{FIELD}.url")
    return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"


def _endpoint(url: str) -> str:
    if not url:
        return ""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput("must be an http:// or https:// URL of an S3-compatible server "
                           "(empty: AWS)", field=f"{FIELD}.endpoint_url")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise InvalidInput("must hold no credentials, query or fragment",
                           field=f"{FIELD}.endpoint_url")
    try:
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise InvalidInput("has an invalid port", field=f"{FIELD}.endpoint_url") from None
    return url.rstrip("/")


def _path(value: str) -> str:
    path = value or DEFAULT_PATH
    normal = posixpath.normpath(path)
    if not path.startswith("/") or ".." in path.split("/") or not (
            normal == WORKSPACE or normal.startswith(WORKSPACE + "/")):
        raise InvalidInput(f"must be an absolute path under {WORKSPACE} (the lease's "
                           f"workspace), such as {DEFAULT_PATH}", field=f"{FIELD}.path")
    return normal


def clean(data) -> Checkpoint | None:
    """The bid's `checkpoint` JSON object checked (no network): None for null or absent.
    Unknown keys refused, by name. Raises InvalidInput."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise InvalidInput("must be a JSON object {url, endpoint_url, access_key_id, "
                           "secret_access_key, region, path, max_bytes}", field=FIELD)
    for key in data:
        if key not in KEYS:
            raise InvalidInput(f"unknown key {str(key)[:40]!r}; known: {', '.join(KEYS)}",
                               field=FIELD)
    url = _bucket_url(_text(data, "url", max_length=1024, required=True))
    endpoint = _endpoint(_text(data, "endpoint_url", max_length=512))
    region = _text(data, "region", max_length=64)
    path = _path(_text(data, "path", max_length=512))
    max_bytes = data.get("max_bytes", DEFAULT_MAX_BYTES)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) \
            or not 1 <= max_bytes <= MAX_MAX_BYTES:
        raise InvalidInput(f"must be a whole number of bytes from 1 to {MAX_MAX_BYTES} "
                           "(1 TiB)", field=f"{FIELD}.max_bytes")
    credentials = {key: _text(data, key, max_length=256, required=True) for key in CREDENTIALS}
    terms = {"url": url, "endpoint_url": endpoint, "region": region, "path": path,
             "max_bytes": max_bytes}
    return Checkpoint(terms=terms, credentials=credentials)


def _check_host(endpoint: str) -> None:
    """Refuse an endpoint whose host resolves to a private, loopback, link-local or
    reserved address (unless GPUMARKET_CHECKPOINT_ALLOW_PRIVATE), or does not resolve."""
    parts = urlsplit(endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise InvalidInput(f"endpoint_url: host {parts.hostname} does not resolve",
                           field=FIELD) from None
    if settings.GPUMARKET_CHECKPOINT_ALLOW_PRIVATE:
        return
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global:
            raise InvalidInput(f"endpoint_url: host {parts.hostname} is a private or local "
                               "address; the checkpoint store must be reachable on the "
                               "internet", field=FIELD)


def client(terms: dict, credentials: dict, *, timeout: float = PROBE_TIMEOUT_S):
    """A boto3 S3 client for the store (path-style addressing; no retry)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=terms["endpoint_url"] or None,
        region_name=terms["region"] or "us-east-1",
        aws_access_key_id=credentials["access_key_id"],
        aws_secret_access_key=credentials["secret_access_key"],
        config=Config(connect_timeout=timeout, read_timeout=timeout,
                      retries={"max_attempts": 1, "mode": "standard"},
                      s3={"addressing_style": "path"}))


def probe(cp: Checkpoint) -> None:
    """A HEAD of the bucket and a listing of one key: InvalidInput naming `checkpoint`
    with the reason when the endpoint is not allowed, unreachable or not S3, the bucket
    missing, or the credentials refused."""
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

    if cp.terms["endpoint_url"]:
        _check_host(cp.terms["endpoint_url"])
    where = cp.terms["endpoint_url"] or "AWS S3"
    try:
        s3 = client(cp.terms, cp.credentials)
        s3.head_bucket(Bucket=cp.bucket)
        # a web server answers HEAD with 200 too: an S3 listing names its bucket (and the
        # runner's restore needs the right to list)
        listing = s3.list_objects_v2(Bucket=cp.bucket, MaxKeys=1,
                                     Prefix=urlsplit(cp.terms["url"]).path.lstrip("/"))
        if listing.get("Name") != cp.bucket:
            raise InvalidInput(f"{where} does not answer as an S3-compatible server (its "
                               "listing of the bucket is not S3's)", field=FIELD)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = str(error.get("Code") or status)
        if code in ("404", "NoSuchBucket"):
            reason = f"no bucket {cp.bucket} at {where}"
        elif code in ("403", "401", "AccessDenied", "InvalidAccessKeyId",
                      "SignatureDoesNotMatch"):
            reason = f"{where} refused the credentials for bucket {cp.bucket} ({code})"
        else:
            reason = f"{where} does not answer as an S3-compatible server ({code})"
        raise InvalidInput(reason, field=FIELD) from None
    except EndpointConnectionError:
        raise InvalidInput(f"{where} is unreachable", field=FIELD) from None
    except (BotoCoreError, ValueError) as exc:
        raise InvalidInput(f"{where} does not answer as an S3-compatible server "
                           f"({exc.__class__.__name__})", field=FIELD) from None


def public(terms: dict | None) -> dict | None:
    """The API's view of a stored checkpoint: its terms and `credentials: "set"`; None."""
    if not terms:
        return None
    return {**terms, "credentials": "set"}


def runner_payload(lease) -> dict | None:
    """What the lease's runner gets (issue 15's contract): {endpoint_url, bucket, prefix
    "<chain id>/", region, access_key_id, secret_access_key, path, max_bytes, restore};
    None without a checkpoint. `restore` for a lease that continues a chain. Raises
    sealing.Unsealable."""
    terms = lease.checkpoint
    if not terms:
        return None
    parts = urlsplit(terms["url"])
    base = parts.path.strip("/")
    prefix = f"{base}/{lease.chain}/" if base else f"{lease.chain}/"
    return {"endpoint_url": terms["endpoint_url"], "bucket": parts.netloc, "prefix": prefix,
            "region": terms["region"], **unseal(lease.checkpoint_sealed),
            "path": terms["path"], "max_bytes": terms["max_bytes"],
            "restore": lease.continues_id is not None or lease.chain_id is not None}
