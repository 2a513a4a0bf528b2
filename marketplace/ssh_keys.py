"""Buyers' SSH public keys: parse and check one (`parse_public_key`), add, list and
delete them (`add_key`, `delete_key`), and the lines a new lease's authorized_keys gets
(`authorized_lines`). Rules (docs/ARCHITECTURE.md, "SSH"): ed25519, ECDSA on nistp256/
384/521 and RSA of at least 2048 bits, parsed by `cryptography`'s load_ssh_public_key;
one key per request, in the one-line OpenSSH form, with no authorized_keys options;
at most MAX_KEYS per account. Every refusal is InvalidInput naming the field.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from core.text import bad_character_message
from marketplace.errors import InvalidInput, NotFound
from marketplace.models import SshKey

MAX_KEYS = 20
MAX_KEY_CHARS = 8192  # an RSA key of 16384 bits is about 2,800 characters
MIN_RSA_BITS = 2048
MAX_NAME_CHARS = 100
ACCEPTED = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
            "ecdsa-sha2-nistp521", "ssh-rsa")
_CURVES = {"secp256r1": "ecdsa-sha2-nistp256", "secp384r1": "ecdsa-sha2-nistp384",
           "secp521r1": "ecdsa-sha2-nistp521"}
_KEY_TYPE = re.compile(r"^(ssh-[a-z0-9-]+|ecdsa-sha2-[a-z0-9-]+|sk-[a-z0-9@.-]+|"
                       r"[a-z0-9-]+-cert-v0[0-9]@openssh\.com)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_FIELD = "public_key"


@dataclass(frozen=True)
class ParsedKey:
    """key_type: e.g. "ssh-ed25519"; public_key: "<type> <base64>" (no comment);
    fingerprint: "SHA256:<unpadded base64>"; comment: what followed the key ("" if none)."""

    key_type: str
    public_key: str
    fingerprint: str
    comment: str


def fingerprint(blob: bytes) -> str:
    """OpenSSH's SHA256 fingerprint of a key blob (as `ssh-keygen -l -E sha256`)."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def parse_public_key(text: object, *, field: str = _FIELD) -> ParsedKey:
    """One OpenSSH public key line → ParsedKey. Raises InvalidInput naming `field` (and
    the problem, never echoing a private key) for anything but one accepted key."""
    if not isinstance(text, str):
        raise InvalidInput("must be a string: one OpenSSH public key line", field=field)
    bad = bad_character_message(text)
    if bad:
        raise InvalidInput(bad, field=field)
    if "PRIVATE KEY" in text or text.lstrip().startswith("-----BEGIN"):
        raise InvalidInput("is a private key: paste the public key (the .pub file, e.g. "
                           "~/.ssh/id_ed25519.pub), and keep the private key to yourself",
                           field=field)
    if len(text) > MAX_KEY_CHARS:
        raise InvalidInput(f"is too long: a public key has at most {MAX_KEY_CHARS} "
                           "characters", field=field)
    line = text.strip()
    if not line:
        raise InvalidInput("is empty: paste one OpenSSH public key line", field=field)
    if "\n" in line or "\r" in line:
        raise InvalidInput("holds several lines: one public key per request", field=field)
    parts = line.split(None, 2)
    key_type = parts[0]
    if not _KEY_TYPE.match(key_type):
        if any(t in line for t in ACCEPTED):
            raise InvalidInput("starts with options (e.g. command=, from=, no-pty): give "
                               "the key alone, `<type> <base64> [comment]`", field=field)
        raise InvalidInput("is not an OpenSSH public key: expected `ssh-ed25519 AAAA… "
                           "[comment]` (ed25519, ECDSA or RSA ≥ 2048 bits)", field=field)
    if key_type not in ACCEPTED:
        raise InvalidInput(f"{key_type} keys are not accepted: use ed25519, ECDSA "
                           f"(nistp256/384/521) or RSA of at least {MIN_RSA_BITS} bits",
                           field=field)
    if len(parts) < 2:
        raise InvalidInput(f"has the type {key_type} but no key data after it", field=field)
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("key data is not valid base64", field=field) from None
    try:
        key = serialization.load_ssh_public_key(f"{key_type} {parts[1]}".encode())
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise InvalidInput(f"does not parse as a {key_type} key ({exc})", field=field) \
            from None
    actual = _type_of(key, field)
    if actual != key_type:
        raise InvalidInput(f"says {key_type} but holds a {actual} key", field=field)
    comment = parts[2].strip() if len(parts) > 2 else ""
    if _CONTROL.search(comment):
        raise InvalidInput("comment must not hold control characters", field=field)
    return ParsedKey(key_type=key_type, public_key=f"{key_type} {parts[1]}",
                     fingerprint=fingerprint(blob), comment=comment[:MAX_NAME_CHARS])


def _type_of(key, field: str) -> str:
    if isinstance(key, ed25519.Ed25519PublicKey):
        return "ssh-ed25519"
    if isinstance(key, ec.EllipticCurvePublicKey):
        if key.curve.name not in _CURVES:
            raise InvalidInput(f"ECDSA on {key.curve.name} is not accepted: nistp256, "
                               "nistp384 or nistp521", field=field)
        return _CURVES[key.curve.name]
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            raise InvalidInput(f"is an RSA key of {key.key_size} bits: at least "
                               f"{MIN_RSA_BITS} are needed", field=field)
        return "ssh-rsa"
    if isinstance(key, dsa.DSAPublicKey):
        raise InvalidInput("DSA keys are not accepted: use ed25519", field=field)
    raise InvalidInput("this kind of key is not accepted: use ed25519", field=field)


def clean_name(name: object, *, default: str) -> str:
    """A key's name: 1–MAX_NAME_CHARS characters with no control character; missing or
    blank: `default`. Raises InvalidInput naming `name`."""
    if name is None or (isinstance(name, str) and not name.strip()):
        name = default
    if not isinstance(name, str):
        raise InvalidInput("must be a string", field="name")
    name = name.strip()
    if bad_character_message(name) or _CONTROL.search(name):
        raise InvalidInput("must not hold control characters", field="name")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidInput(f"must be at most {MAX_NAME_CHARS} characters", field="name")
    return name


def add_key(*, owner_id: int, public_key: object, name: object = None) -> SshKey:
    """Add a key to `owner_id`'s account. Refused (InvalidInput, nothing written): a key
    that does not pass parse_public_key, one already there (same fingerprint), a bad
    name, or a MAX_KEYS + 1st key. The owner's row is locked, so two adds cannot both be
    the 20th."""
    parsed = parse_public_key(public_key)
    name = clean_name(name, default=parsed.comment or parsed.key_type)
    with transaction.atomic():
        get_user_model().objects.select_for_update().filter(pk=owner_id).first()
        keys = SshKey.objects.filter(owner_id=owner_id)
        same = keys.filter(fingerprint=parsed.fingerprint).first()
        if same is not None:
            raise InvalidInput(f"is already on your account, as “{same.name}” "
                               f"({parsed.fingerprint})", field=_FIELD)
        if keys.count() >= MAX_KEYS:
            raise InvalidInput(f"you have {MAX_KEYS} SSH keys, the most an account may "
                               "hold: delete one first", field=_FIELD)
        try:
            with transaction.atomic():
                return SshKey.objects.create(
                    owner_id=owner_id, name=name, public_key=parsed.public_key,
                    key_type=parsed.key_type, fingerprint=parsed.fingerprint)
        except IntegrityError:
            raise InvalidInput("is already on your account", field=_FIELD) from None


def delete_key(*, owner_id: int, key_id: int) -> None:
    """Delete one of the owner's keys; NotFound (404) for a missing or another's key.
    Leases already created keep the keys they were given; the next one does not get it."""
    deleted, _ = SshKey.objects.filter(pk=key_id, owner_id=owner_id).delete()
    if not deleted:
        raise NotFound(f"you have no SSH key {key_id}")  # the URL's id, no request field


def authorized_lines(owner_id: int) -> list[str]:
    """The owner's keys as authorized_keys lines, `<type> <base64> <name>`, oldest first
    (what a new lease with ssh copies into Lease.ssh_public_keys)."""
    return [f"{k.public_key} {k.name}" for k in SshKey.objects.filter(owner_id=owner_id)]


NO_KEY = ("needs an SSH key on your account: add one first (POST /api/v1/ssh-keys/, or "
          "\"SSH keys\" on the wallet page), or place the bid without ssh (\"ssh\": false; "
          "a template with an ssh port, such as pytorch-jupyter, turns it on)")


def require_key(owner_id: int, ssh: bool) -> None:
    """A bid with `ssh` needs a key its leases can be given: InvalidInput (field "ssh")
    when the owner has none (the lease would show an ssh command no key opens)."""
    if ssh and not SshKey.objects.filter(owner_id=owner_id).exists():
        raise InvalidInput(NO_KEY, field="ssh")
