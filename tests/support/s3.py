"""An S3-compatible server for the checkpoint tests: moto's server (`moto_server`, from
moto[server]) in a subprocess on 127.0.0.1, started once per test session, WITH
credentials enforced (INITIAL_NO_AUTH_ACTION_COUNT: the first three calls make an IAM
user with an access key allowed everything; every later call must be signed with that
key — so wrong credentials are refused as by a real store)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.net import free_port


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    access_key_id: str
    secret_access_key: str

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
                            aws_access_key_id=self.access_key_id,
                            aws_secret_access_key=self.secret_access_key)

    def bucket(self, name: str) -> str:
        """Create bucket `name` (if missing); returns its name."""
        s3 = self.client()
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                        Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def read(self, bucket: str, key: str) -> bytes:
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with status {proc.returncode}")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError("moto_server did not listen in time")


def start() -> tuple[subprocess.Popen, S3Server]:
    """Start moto_server and make its one user; (process, server)."""
    import boto3

    exe = Path(sys.executable).with_name("moto_server")
    command = [str(exe)] if exe.exists() else [shutil.which("moto_server") or "moto_server"]
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
    proc = subprocess.Popen([*command, "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, proc)
        url = f"http://127.0.0.1:{port}"
        iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1",
                           aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
        iam.create_user(UserName="checkpoints")
        key = iam.create_access_key(UserName="checkpoints")["AccessKey"]
        iam.put_user_policy(UserName="checkpoints", PolicyName="all",
                            PolicyDocument='{"Version": "2012-10-17", "Statement": [{'
                                           '"Effect": "Allow", "Action": "*", '
                                           '"Resource": "*"}]}')
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, S3Server(url, key["AccessKeyId"], key["SecretAccessKey"])
