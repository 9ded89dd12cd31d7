"""Trying fastload against a writable local S3 (issue 28 item 16): the command docs/s3.md gives (moto's
``moto_server`` on loopback), ``fastload mb`` to create a bucket, then pack, verify, ls and read there."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import fastload
from fastload.cli import main
from fastload.s3 import runtime

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def local_s3(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """``moto_server -p PORT`` as docs/s3.md has it, and the variables it tells the user to set."""
    port = free_port()
    exe = shutil.which("moto_server")
    command = [exe] if exe else [sys.executable, "-m", "moto.server"]
    proc = subprocess.Popen([*command, "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"moto_server did not start on {endpoint}")
                time.sleep(0.1)
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
        yield endpoint
    finally:
        runtime.reset()
        proc.terminate()
        proc.wait(timeout=10)


def test_the_documented_local_endpoint_takes_a_new_bucket_and_a_packed_dataset(
    local_s3: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "moto_server -p 5000" in (ROOT / "docs" / "s3.md").read_text()  # the command tested here
    assert main(["demo-data", str(tmp_path / "src"), "--samples", "20"]) == 0
    assert main(["pack", str(tmp_path / "src"), "s3://trial/ds"]) == 1
    err = capsys.readouterr().err
    assert "NoSuchBucket" in err and "fastload mb s3://trial" in err, err  # what to do

    assert main(["mb", "s3://trial"]) == 0
    assert "make_bucket: s3://trial" in capsys.readouterr().out
    assert main(["mb", "s3://trial/"]) == 0  # again: nothing to do, not an error
    assert "already exists (yours)" in capsys.readouterr().out
    assert main(["pack", str(tmp_path / "src"), "s3://trial/ds"]) == 0
    assert main(["verify", "s3://trial/ds"]) == 0
    capsys.readouterr()
    assert main(["ls", "s3://trial/ds/"]) == 0
    assert "index.json" in capsys.readouterr().out
    assert len(fastload.ShardDataset("s3://trial/ds")) == 20


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("s3://Trial_Bucket", "not a valid bucket name"),
        ("s3://ab", "not a valid bucket name"),
        ("s3://trial/key", "fastload mb takes a bucket: s3://trial"),
        ("trial", "is not an s3:// URL"),
    ],
)
def test_mb_refuses_what_is_not_a_bucket(url: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mb", url]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_mb_in_another_region(local_s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastload.s3.buckets import make_bucket

    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert make_bucket("s3://trial-eu") is True
    assert make_bucket("s3://trial-eu") is False
    assert os.environ["AWS_ENDPOINT_URL"] == local_s3


def test_mb_of_a_bucket_these_credentials_may_not_use_says_so(
    local_s3: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """S3 answers a HEAD of another account's bucket with 403: the name is taken (or the policy refuses),
    which is what mb says, not a bare access-denied."""
    from fastload.testing.faultplan import Fault
    from fastload.testing.faultproxy import FaultProxy, Rule

    with FaultProxy(local_s3) as proxy:
        proxy.add(Rule(Fault.access_denied(), method="HEAD"))
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
        assert main(["mb", "s3://someone-elses"]) == 1
    err = capsys.readouterr().err
    assert "s3://someone-elses exists but these credentials may not use it" in err, err
    assert "choose another name" in err and "s3:ListBucket" in err and "Traceback" not in err
