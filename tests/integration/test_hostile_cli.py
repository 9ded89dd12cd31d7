"""Hostile environments and inputs at the entry points (issue 16): missing credentials, mistyped S3 URLs,
output piped into ``head``, an empty or missing source, file modes. Each says what happened and what to do,
exits non-zero, and never shows a traceback."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

import fastload
from fastload.cli import main
from fastload.errors import AccessDeniedError, ConfigError, NotFoundError
from fastload.s3 import runtime

ROOT = Path(__file__).resolve().parents[2]
CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No credentials anywhere botocore looks, and an endpoint nothing listens on (never reached)."""
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    runtime.reset()
    yield
    runtime.reset()


@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "s3://bkt/x/"],
        ["ls", "-r", "s3://bkt/x/"],
        ["cp", "-r", "s3://bkt/x/", "{tmp}/out"],
        ["cp", "s3://bkt/x/a.bin", "{tmp}/a.bin"],
        ["cp", "-r", "{src}", "s3://bkt/y/"],
        ["verify", "s3://bkt/x"],
        ["inspect", "s3://bkt/x"],
        ["index", "s3://bkt/x"],
        ["pack", "s3://bkt/x/", "{tmp}/packed"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_missing_credentials_give_one_clear_message_everywhere(
    no_credentials: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    rc = main([a.format(tmp=tmp_path, src=src) for a in argv])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "no AWS credentials found" in err and "AWS_ACCESS_KEY_ID" in err and "AWS_PROFILE" in err, err
    assert "s3://bkt/" in err  # names the object or prefix
    assert "Traceback" not in err and "botocore" not in err


def test_missing_credentials_in_python(no_credentials: None) -> None:
    with pytest.raises(AccessDeniedError, match="no AWS credentials found"):
        fastload.ShardDataset("s3://bkt/x")


@pytest.mark.parametrize("typo", ["s3:/bkt/x", "S3://bkt/x", "s3//bkt/x", "s3:///bkt/x", "s3:bkt/x"])
def test_mistyped_s3_urls_are_not_taken_for_local_paths(
    typo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    for argv in (["ls", typo], ["pack", "src", typo], ["cp", "-r", "src", typo], ["verify", typo]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "did you mean s3://bkt/x?" in err, (argv, err)
    assert sorted(os.listdir(tmp_path)) == ["src"], "a mistyped URL made a local folder"
    with pytest.raises(ConfigError, match="did you mean s3://bkt/x"):
        fastload.ShardDataset(typo)
    with pytest.raises(ConfigError, match="did you mean s3://bkt/x"):
        fastload.open(typo)
    assert main(["ls", "src"]) == 0  # a plain relative path is still a path


@pytest.mark.parametrize("url", ["gcs://b/p", "abfs://c/p", "s3a://b/p", "ftp://host/x.tar"])
def test_unsupported_url_schemes_are_refused_listing_the_supported_ones(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 28 item 10: an http(s)/gs/hf... URL was read as a local path ("/cwd/https:/example.com/data/
    index.json not found"); every entry point now says which schemes fastload reads."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    supported = "local paths, file://, s3://"
    argvs = (["ls", url], ["pack", "src", url], ["pack", url, "out"], ["cp", "-r", url, "dst"])
    for argv in (*argvs, ["cp", "-r", "src", url], ["verify", url], ["inspect", url], ["index", url]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert supported in err and url in err and "Traceback" not in err, (argv, err)
    assert sorted(os.listdir(tmp_path)) == ["src"], "an unsupported URL made a local folder"
    for call in (
        lambda: fastload.ShardDataset(url),
        lambda: fastload.MapDataset(url),
        lambda: fastload.open(url),
        lambda: fastload.pack("src", url),
        lambda: fastload.pack(url, "out"),
        lambda: fastload.copy(url, "out", recursive=True),
        lambda: fastload.copy("src/a.txt", url),
        lambda: fastload.verify(url),
    ):
        with pytest.raises(ConfigError, match=supported):
            call()
    # an http:// endpoint is not a dataset URL; a local folder whose name has "://" is reached as ./
    assert main(["ls", "--endpoint-url", "http://127.0.0.1:1", "src"]) == 0
    odd = tmp_path / "src" / "http:" / "x"
    odd.mkdir(parents=True)
    (odd / "b.txt").write_text("b")
    assert main(["ls", "./src/http://x"]) == 0


def test_output_piped_into_head_ends_quietly(tmp_path: Path) -> None:
    """`fastload ls -r DIR | head -1`: the reader goes away; fastload stops without a word, as Unix tools
    do (no "Broken pipe", no traceback)."""
    for i in range(4000):  # far more than a pipe buffer of output
        (tmp_path / f"file-{i:05d}.bin").write_bytes(b"x")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "fastload", "ls", "-r", str(tmp_path)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read().decode()
        rc = proc.wait(timeout=60)
    assert first.strip().endswith(b".bin")
    assert "Broken pipe" not in err and "Traceback" not in err and "Exception ignored" not in err, err
    assert rc == 0


def test_index_json_has_the_shards_mode(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    old = os.umask(0o022)
    try:
        fastload.pack(str(src), str(tmp_path / "ds"), progress=False)
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "ds").iterdir()}
    assert modes["index.json"] == 0o644, modes
    assert len(set(modes.values())) == 1, modes


def test_copying_a_missing_or_empty_folder_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cp", "-r", str(tmp_path / "missing"), "s3://bkt/x/"]) == 1
    assert "missing is not found" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["cp", "-r", str(tmp_path / "empty"), "s3://bkt/x/"]) == 1
    assert "no files under" in capsys.readouterr().err


def test_an_empty_prefix_says_it_is_empty(
    moto_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    runtime.reset()
    boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1").create_bucket(Bucket="hostile-empty")
    try:
        assert main(["ls", "s3://hostile-empty/none/"]) == 1
        assert "nothing under s3://hostile-empty/none/" in capsys.readouterr().err
        assert main(["cp", "-r", "s3://hostile-empty/none/", str(tmp_path / "out")]) == 1
        assert "no objects under" in capsys.readouterr().err
        assert main(["pack", "s3://hostile-empty/none/", str(tmp_path / "ds")]) == 1
        assert "no samples found" in capsys.readouterr().err
        with pytest.raises(NotFoundError, match=r"is empty or missing: no index\.json and no tar"):
            fastload.ShardDataset("s3://hostile-empty/none")
    finally:
        runtime.reset()


def _can_unshare_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30).returncode == 0


FULL_DISK = """
set -u
mount -t tmpfs -o size=3m tmpfs "$MNT" || exit 90
"$PY" -m fastload pack "$SRC" "$MNT/ds" --shard-size 1MB --quiet; echo "rc1=$?"
ls "$MNT/ds" | sed 's/^/LS /'
mount -o remount,size=20m "$MNT"
"$PY" -m fastload pack "$SRC" "$MNT/ds" --shard-size 1MB --quiet --resume; echo "rc2=$?"
"$PY" -m fastload verify "$MNT/ds"; echo "rc3=$?"
umount "$MNT"
mount -t tmpfs -o size=3m,ro tmpfs "$MNT"
"$PY" -m fastload pack "$SRC" "$MNT/ro" --quiet; echo "rc4=$?"
"""


@pytest.mark.skipif(not _can_unshare_mount(), reason="needs root and unshare -m (a small tmpfs)")
def test_full_disk_and_read_only_destination(tmp_path: Path) -> None:
    """Disk full during pack: a clear error naming the destination, no partial shard under a final name,
    and --resume completes once there is space. A read-only destination: a clear error too."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"{i:03d}.bin").write_bytes(os.urandom(200_000))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PY": sys.executable, "SRC": str(src), "MNT": str(mnt)}
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", FULL_DISK], capture_output=True, text=True, env=env, timeout=300
    )
    out, err = proc.stdout, proc.stderr
    assert "rc1=1" in out, out + err
    assert f"cannot write to {mnt}/ds: no space left on the device" in err and "--resume" in err, err
    assert "Traceback" not in err
    listed = [line[3:] for line in out.splitlines() if line.startswith("LS ")]
    shards = [name for name in listed if name.startswith("shard-") and name.endswith(".tar")]
    tables = [name for name in listed if name.endswith(".fltable")]  # each published shard's sample table
    assert shards and sorted(shards + tables) == sorted(listed), listed
    assert {name.removesuffix(".fltable") for name in tables} <= set(shards), listed
    assert "rc2=0" in out and "rc3=0" in out, out + err
    assert "rc4=1" in out and "read-only file system" in err, out + err


@pytest.mark.parametrize("url", ["https://example.com/data/", "http://127.0.0.1:1/x", "hf://datasets/o/n/p"])
def test_web_urls_are_read_but_never_written(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32: https:// and hf:// are read (docs/stores.md); as a destination (pack, cp, index) they
    are refused with the fix, and nothing local is made under a name like "https:"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    for argv in (["pack", "src", url], ["cp", "-r", "src", url], ["cp", "src/a.txt", url], ["index", url]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "cannot write to them" in err and url in err and "Traceback" not in err, (argv, err)
    assert main(["pack", url, "out"]) == 2
    assert "copy web files first" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["src"], "a web URL made a local folder"
    with pytest.raises(ConfigError, match="cannot write to them"):
        fastload.pack("src", url)
    with pytest.raises(ConfigError, match="cannot write to them"):
        fastload.copy("src/a.txt", url)
