"""SSH keys and a real SSH client for the tests: key pairs made with `cryptography`
(`key_pair`), their OpenSSH public lines, and `ssh_login` — paramiko connecting to a real
sshd on 127.0.0.1 with one private key (True when the server accepts it, False when it
refuses it, None when nothing answers on the port)."""

from __future__ import annotations

import io
import socket
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

SSH_IMAGE = "gpumarket/sshd:local"  # scripts/build-ssh-image.sh
SSH_IMAGE_VERSION = "3"  # its label gpumarket.sshd-image: 2 runs a command it is given, 3
# gives sessions the container's environment (scripts/build-ssh-image.sh)


@dataclass(frozen=True)
class KeyPair:
    private: object  # a cryptography private key
    public_line: str  # "<type> <base64> <comment>"

    def private_openssh(self) -> str:
        return self.private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption()).decode()


def key_pair(kind: str = "ed25519", comment: str = "test@laptop") -> KeyPair:
    """A new key pair: kind "ed25519", "ecdsa-256|384|521" or "rsa-<bits>"."""
    if kind == "ed25519":
        private = ed25519.Ed25519PrivateKey.generate()
    elif kind.startswith("ecdsa-"):
        curve = {"256": ec.SECP256R1, "384": ec.SECP384R1, "521": ec.SECP521R1}[kind[6:]]
        private = ec.generate_private_key(curve())
    elif kind.startswith("rsa-"):
        private = rsa.generate_private_key(public_exponent=65537, key_size=int(kind[4:]))
    else:
        raise ValueError(kind)
    line = private.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                             serialization.PublicFormat.OpenSSH).decode()
    return KeyPair(private=private, public_line=f"{line} {comment}".strip())


def ssh_login(port: int, pair: KeyPair, *, host: str = "127.0.0.1",
              command: str = "echo logged-in-as-$(id -un)") -> bool | None:
    """Log in as root with `pair`'s private key and run `command`: True when the key is
    accepted and the command printed what it should, False when the server refuses the
    key, None when no SSH server answers (port closed, or not speaking SSH yet)."""
    import paramiko

    pkey = _paramiko_key(pair)
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    try:
        client.connect(host, port=port, username="root", pkey=pkey, timeout=3,
                       banner_timeout=3, auth_timeout=3, allow_agent=False,
                       look_for_keys=False)
    except paramiko.AuthenticationException:
        return False
    except (OSError, paramiko.SSHException, EOFError):
        return None
    try:
        _, stdout, _ = client.exec_command(command, timeout=5)
        return stdout.read().decode().strip() == "logged-in-as-root"
    finally:
        client.close()


def ssh_output(port: int, pair: KeyPair, command: str, *, host: str = "127.0.0.1") -> str:
    """What `command` prints (stdout) in an SSH session as root with `pair`'s key."""
    import paramiko

    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect(host, port=port, username="root", pkey=_paramiko_key(pair), timeout=5,
                   banner_timeout=5, auth_timeout=5, allow_agent=False, look_for_keys=False)
    try:
        _, stdout, _ = client.exec_command(command, timeout=5)
        return stdout.read().decode()
    finally:
        client.close()


def _paramiko_key(pair: KeyPair):
    import paramiko

    text = io.StringIO(pair.private_openssh())
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        text.seek(0)
        try:
            return cls.from_private_key(text)
        except paramiko.SSHException:
            continue
    raise ValueError("paramiko cannot load this key")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts a TCP connection on host:port."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False
