"""Helpers for the RGW integration tests: fastload settings for an endpoint, the real CLI in a subprocess
with those settings, and small readers of bucket state (keys, bytes, open multipart uploads)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastload.config import S3Config

MIB = 1 << 20
KIB = 1 << 10
CLI_TIMEOUT_S = 60


def payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def s3_config(server: Any, *, endpoint_url: str | None = None, **overrides: Any) -> S3Config:
    """Explicit fastload settings for ``server`` (or a proxy in front of it at ``endpoint_url``)."""
    return S3Config(
        endpoint_url=endpoint_url or server.endpoint_url,
        region=server.region,
        addressing_style="path",
        **overrides,
    )


def s3_env(server: Any, *, endpoint_url: str | None = None) -> dict[str, str]:
    """The environment variables ``S3Config.from_env()`` and botocore read, for ``server``."""
    return {
        "AWS_ENDPOINT_URL": endpoint_url or server.endpoint_url,
        "AWS_ACCESS_KEY_ID": server.access_key,
        "AWS_SECRET_ACCESS_KEY": server.secret_key,
        "AWS_REGION": server.region,
        "FASTLOAD_S3_ADDRESSING_STYLE": "path",
    }


# Variables that would point botocore somewhere else than the test's server.
FOREIGN_AWS_VARIABLES = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ENDPOINT_URL_S3",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_SECURITY_TOKEN",
)


def subprocess_env(env: dict[str, str], tmp_dir: Path | None = None) -> dict[str, str]:
    """``os.environ`` without foreign AWS settings, plus ``env``; temporary files under ``tmp_dir``."""
    out = {
        k: v
        for k, v in os.environ.items()
        if k not in FOREIGN_AWS_VARIABLES and not k.startswith(("PYTHONWARNINGS", "COVERAGE"))
    }
    out.update({"PYTHONIOENCODING": "utf-8", "LC_ALL": "C.UTF-8", "AWS_CONFIG_FILE": os.devnull})
    out["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    if tmp_dir is not None:
        out["TMPDIR"] = str(tmp_dir)
    out.update(env)
    return out


def fastload_argv(*args: str | os.PathLike[str]) -> list[str]:
    return [sys.executable, "-m", "fastload", *(os.fspath(a) for a in args)]


def run_cli(
    *args: str | os.PathLike[str],
    env: dict[str, str],
    check: int | None = 0,
    timeout_s: float = CLI_TIMEOUT_S,
    tmp_dir: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m fastload ARGS`` with ``env`` added; ``check`` asserts the exit status (None: don't)."""
    argv = fastload_argv(*args)
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="backslashreplace",
        env=subprocess_env(env, tmp_dir),
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )
    if check is not None:
        assert proc.returncode == check, (
            f"{' '.join(argv[2:])} exited {proc.returncode}, expected {check}\n"
            f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
        )
    return proc


def keys_under(client: Any, bucket: str, prefix: str = "") -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [obj["Key"] for page in pages for obj in page.get("Contents", [])]


def etags_under(client: Any, bucket: str, prefix: str = "") -> dict[str, str]:
    """Key -> ETag of every object under ``prefix``, from the listing."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {obj["Key"]: obj["ETag"] for page in pages for obj in page.get("Contents", [])}


def objects_under(client: Any, bucket: str, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix``: key relative to the prefix -> bytes."""
    keys = keys_under(client, bucket, prefix)
    with ThreadPoolExecutor(max_workers=16) as pool:
        bodies = pool.map(lambda key: client.get_object(Bucket=bucket, Key=key)["Body"].read(), keys)
        return {key[len(prefix) :]: body for key, body in zip(keys, bodies, strict=True)}


def open_uploads(client: Any, bucket: str, prefix: str = "") -> list[dict[str, Any]]:
    """Multipart uploads started and neither completed nor aborted."""
    pages = client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix)
    return [upload for page in pages for upload in page.get("Uploads", [])]


def key_exists(client: Any, bucket: str, key: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        client.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response["ResponseMetadata"]["HTTPStatusCode"] == 404:
            return False
        raise
    return True


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones included): ``/``-separated relative path -> bytes."""
    out: dict[str, bytes] = {}
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            out[path.relative_to(folder).as_posix()] = path.read_bytes()
    return out


def point_env_at(server: Any, monkeypatch: Any) -> None:
    """This process's environment (and fastload's per-process state) pointed at ``server`` alone: the
    foreign AWS settings removed, :func:`s3_env`'s set."""
    from fastload.s3 import runtime

    for name in FOREIGN_AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_env(server).items():
        monkeypatch.setenv(name, value)
    runtime.reset()
