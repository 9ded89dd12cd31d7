"""Files fastload creates for users get the mode other tools give them, ``0666 & ~umask`` (``cp``, ``tar``,
``open()``), never ``mkstemp``'s private 0600 nor a fixed 0644: packed shards of every format, their sample
tables and ``index.json``, ``fastload index`` output, and files downloaded by ``fastload cp`` (one object
and a prefix). Each case runs in a subprocess under ``umask 002`` (a group-shared folder's usual setting)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

UMASK = 0o002
WANT = 0o666 & ~UMASK


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m fastload ARGS`` under ``umask 002``."""
    proc = subprocess.run(
        [sys.executable, "-m", "fastload", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        preexec_fn=lambda: os.umask(UMASK),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def modes(folder: Path) -> dict[str, int]:
    """Mode bits of every file under ``folder`` (relative path -> mode)."""
    return {
        p.relative_to(folder).as_posix(): stat.S_IMODE(p.stat().st_mode)
        for p in folder.rglob("*")
        if p.is_file()
    }


def source_tree(root: Path) -> Path:
    for i in range(12):
        (root / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i % 3}" / f"{i:03d}.bin").write_bytes(os.urandom(3000 + i))
        (root / f"d{i % 3}" / f"{i:03d}.cls").write_bytes(b"%d" % (i % 4))
    return root


@pytest.mark.parametrize("shard_format", ["tar", "parquet", "tfrecord"])
def test_a_pack_and_its_index_get_the_umask_s_mode(tmp_path: Path, shard_format: str) -> None:
    src = source_tree(tmp_path / "src")
    dst = tmp_path / "ds"
    run("pack", str(src), str(dst), "--format", shard_format, "--max-samples", "4", "--quiet")
    got = modes(dst)
    index = "_fastload/index.json" if shard_format == "parquet" else "index.json"  # (Parquet's sidecars)
    assert index in got and len(got) >= 4, got
    assert got == dict.fromkeys(got, WANT), {k: oct(v) for k, v in got.items()}


def test_fastload_cp_downloads_get_the_umask_s_mode(tmp_path: Path, moto_url: str) -> None:
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=moto_url,
        region_name="us-east-1",
        aws_access_key_id="AKIDMODES",
        aws_secret_access_key="modes-secret",
    )
    s3.create_bucket(Bucket="fastload-modes")
    for i in range(3):
        s3.put_object(Bucket="fastload-modes", Key=f"p/sub/{i}.bin", Body=os.urandom(70_000))
    s3.close()
    env = {
        "AWS_ENDPOINT_URL": moto_url,
        "AWS_ACCESS_KEY_ID": "AKIDMODES",
        "AWS_SECRET_ACCESS_KEY": "modes-secret",
        "AWS_REGION": "us-east-1",
        "FASTLOAD_S3_ADDRESSING_STYLE": "path",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    run("cp", "-r", "s3://fastload-modes/p/", str(tmp_path / "tree"), "--quiet", env=env)
    run("cp", "s3://fastload-modes/p/sub/1.bin", str(tmp_path / "one.bin"), "--quiet", env=env)
    got = {**modes(tmp_path / "tree"), "one.bin": stat.S_IMODE((tmp_path / "one.bin").stat().st_mode)}
    assert len(got) == 4, got
    assert got == dict.fromkeys(got, WANT), {k: oct(v) for k, v in got.items()}
