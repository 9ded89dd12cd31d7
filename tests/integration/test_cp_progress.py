"""``fastload cp`` shows a progress bar of bytes on a terminal and nothing otherwise (issue 19); the upload's
``on_bytes`` calls add up to the file, part by part."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from fastload.cli import main
from fastload.config import S3Config
from fastload.copy import copy
from fastload.s3 import runtime
from fastload.s3.upload import upload_file

BUCKET = "cp-progress"


@pytest.fixture
def s3_bucket(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    runtime.reset()
    boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    try:
        yield BUCKET
    finally:
        runtime.reset()


def _bar_total(err: str) -> str:
    """The last ``done/total`` figure tqdm drew (``12.0k/12.0k``)."""
    found = re.findall(r"([\d.]+[kMG]?)/([\d.]+[kMG]?)", err)
    assert found, err
    return "/".join(found[-1])


def test_cp_draws_a_bar_of_bytes_when_asked(
    s3_bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.bin").write_bytes(bytes([i]) * 4096)
    up = copy(str(src), f"s3://{s3_bucket}/up/", recursive=True, progress=True)
    err = capsys.readouterr().err
    assert up.bytes == 3 * 4096
    assert "copying 3 file(s)" in err and "100%" in err
    assert _bar_total(err) == "12.0k/12.0k"

    down = copy(f"s3://{s3_bucket}/up/", str(tmp_path / "down"), recursive=True, progress=True)
    err = capsys.readouterr().err
    assert down.bytes == 3 * 4096 and "copying 3 file(s)" in err and _bar_total(err) == "12.0k/12.0k"

    one = copy(f"s3://{s3_bucket}/up/1.bin", str(tmp_path / "one.bin"), progress=True)
    err = capsys.readouterr().err
    assert one.bytes == 4096 and "copying 1 file(s)" in err and _bar_total(err) == "4.00k/4.00k"
    assert (tmp_path / "one.bin").read_bytes() == bytes([1]) * 4096


def test_cp_is_silent_when_stderr_is_not_a_terminal(
    s3_bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.bin").write_bytes(b"x" * 1000)
    assert main(["cp", str(tmp_path / "a.bin"), f"s3://{s3_bucket}/quiet/a.bin"]) == 0
    assert main(["cp", f"s3://{s3_bucket}/quiet/a.bin", str(tmp_path / "b.bin")]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "copied 1 file(s), 1,000 bytes" in captured.out


def test_upload_reports_every_part(s3_bucket: str, tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    path.write_bytes(b"y" * ((5 << 20) + 1000))  # two parts of a multipart upload at the 5 MiB minimum
    seen: list[int] = []
    upload_file(str(path), s3_bucket, "big.bin", config=S3Config.from_env(), on_bytes=seen.append)
    assert sorted(seen) == [1000, 5 << 20]
