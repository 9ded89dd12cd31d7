"""S3 without signing (issue 32): ``S3Config(unsigned=True)`` and ``--no-sign-request`` read a bucket with no
credentials anywhere, over both transports; without it the missing credentials are reported as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

import fastload
from fastload.errors import AccessDeniedError
from fastload.testing.faultproxy import FaultProxy

from .helpers import run_cli

BUCKET = "fastload-public"


@pytest.fixture
def public(moto_url: str, www: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """A public bucket holding the packed dataset (written with credentials), then no credentials at
    all."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "writer")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "writer-secret")
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET, ACL="public-read")  # moto refuses anonymous reads of private ones
    for path in sorted((www / "ds").iterdir()):
        s3.upload_file(str(path), BUCKET, f"ds/{path.name}", ExtraArgs={"ACL": "public-read"})
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with FaultProxy(moto_url) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
        monkeypatch.setenv("FASTLOAD_S3_ADDRESSING_STYLE", "path")
        yield proxy.endpoint_url


@pytest.mark.parametrize("transport", ["direct", "botocore"])
def test_unsigned_reads_need_no_credentials(public: str, www: Path, transport: str) -> None:
    config = fastload.S3Config.from_env(unsigned=True, transport=transport)
    shard = f"s3://{BUCKET}/ds/shard-000003.tar"
    with fastload.open(shard, config=config) as f:
        assert f.read() == (www / "ds" / "shard-000003.tar").read_bytes()
    keys = [s["__key__"] for s in fastload.ShardDataset(f"s3://{BUCKET}/ds", s3_config=config)]
    assert keys == [s["__key__"] for s in fastload.ShardDataset(str(www / "ds"))]
    signed = fastload.S3Config.from_env(transport=transport)
    with pytest.raises(AccessDeniedError, match="no AWS credentials found"):
        fastload.open(shard, config=signed).read()


def test_no_sign_request_on_the_command_line(public: str, tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/ds"
    for argv in (["verify", url], ["inspect", url], ["ls", url + "/"], ["cp", "-r", url, tmp_path / "copy"]):
        proc = run_cli(*argv, "--no-sign-request", check=0)
        assert "Traceback" not in proc.stderr, proc.stderr
    run_cli("verify", tmp_path / "copy")
    proc = run_cli("verify", url, check=None)
    assert proc.returncode != 0 and "no AWS credentials found" in proc.stderr, proc.stderr
    assert "--no-sign-request" in run_cli("bench", "--help").stdout
