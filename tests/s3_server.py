"""A real S3-compatible server on loopback for the tests: moto's, as a subprocess that dies with its parent.

It checks every request's signature: the first three calls (unauthenticated) make an IAM user allowed
`s3:*` and its access key, and every call after them must be signed with that key (moto recomputes the
SigV4 signature and answers 403 when it differs).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import httpx

from backends.lifetime import die_with_parent, stop_process
from tests.support import free_port

REGION = "us-east-1"
_FREE_CALLS = 3


@dataclass
class S3Server:
    endpoint: str
    access_key_id: str
    secret_access_key: str
    process: subprocess.Popen[bytes]

    @property
    def env(self) -> dict[str, str]:
        """The standard variables, as an operator exports them."""
        return {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}

    def client(self) -> Any:
        """botocore's S3 client on this server, path-style, with the user's key."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            config=boto3.session.Config(s3={"addressing_style": "path"}),
        )


def _iam(endpoint: str) -> Any:
    return boto3.client(
        "iam", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x"
    )


@contextlib.contextmanager
def s3_server(log_dir: Path) -> Iterator[S3Server]:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=(log_dir / "moto.log").open("wb"),
        stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent(),
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_FREE_CALLS), "MOTO_CALL_RESET_API": "false"},
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError((log_dir / "moto.log").read_text())
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{endpoint}/moto-api/", timeout=1)
                break
            if time.monotonic() > deadline:
                raise RuntimeError("moto server did not start")
            time.sleep(0.05)
        iam = _iam(endpoint)
        iam.create_user(UserName="switchyard")
        iam.put_user_policy(
            UserName="switchyard",
            PolicyName="s3",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
                }
            ),
        )
        key = iam.create_access_key(UserName="switchyard")["AccessKey"]
        yield S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"], process)
    finally:
        stop_process(process)
