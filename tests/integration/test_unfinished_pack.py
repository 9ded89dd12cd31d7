"""A pack killed part-way leaves shards and its journal, not a dataset: verify, index, inspect, bench and
every reader refuse the folder (or S3 prefix), naming ``--resume``, which then finishes it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

import fastload
from fastload.errors import UnfinishedPackError

from .helpers import cli_env, run_cli

OPTIONS = ("--workers", "1", "--shard-size", "64KiB")


def killed_pack(src: Path, dst: Path, *, after_shards: int = 3, attempts: int = 3) -> None:
    """``python -m fastload pack`` SIGKILLed once ``after_shards`` shards are published."""
    for _ in range(attempts):
        shutil.rmtree(dst, ignore_errors=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "fastload", "pack", src, dst, "--quiet", *OPTIONS],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=cli_env(),
        )
        try:
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                if dst.is_dir() and len(list(dst.glob("shard-*.tar"))) >= after_shards:
                    proc.send_signal(signal.SIGKILL)
                    break
                time.sleep(0.0005)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if proc.returncode == -signal.SIGKILL and not (dst / "index.json").exists():
            return
    pytest.fail(f"could not interrupt the pack of {src} in {attempts} attempts (it finished too fast)")


@pytest.fixture(scope="module")
def unfinished(thousands_tree, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("unfinished") / "ds"
    killed_pack(thousands_tree.root, dst)
    assert (dst / ".fastload-pack" / "state.json").exists()
    return dst


@pytest.mark.parametrize(
    ("command", "what"),
    [
        (["verify"], "verified"),
        (["index"], "indexed"),
        (["inspect"], "read"),
        (["bench", "--quick"], "bench"),
    ],
)
def test_the_cli_refuses_an_unfinished_pack(unfinished: Path, command: list[str], what: str) -> None:
    proc = run_cli(command[0], unfinished, *command[1:])
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert f"{unfinished} holds an unfinished pack" in proc.stderr, proc.stderr
    assert "--resume" in proc.stderr and what in proc.stderr and "Traceback" not in proc.stderr
    assert not (unfinished / "index.json").exists()


def test_readers_refuse_an_unfinished_pack(unfinished: Path) -> None:
    for make in (
        lambda: fastload.ShardDataset(unfinished),
        lambda: fastload.MapDataset(unfinished),
        lambda: fastload.Mix({"a": fastload.ShardDataset(unfinished)}),
        lambda: fastload.verify(unfinished),
    ):
        with pytest.raises(UnfinishedPackError, match="--resume") as info:
            make()
        assert info.value.url == str(unfinished)


def test_resume_makes_it_a_dataset(unfinished: Path, thousands_tree, tmp_path: Path) -> None:
    dst = tmp_path / "ds"
    shutil.copytree(unfinished, dst)
    run_cli("pack", thousands_tree.root, dst, "--quiet", "--resume", *OPTIONS, check=True)
    assert "OK" in run_cli("verify", dst, check=True).stdout
    assert len(fastload.MapDataset(dst)) == len(thousands_tree.samples())


def test_an_unfinished_pack_on_s3_is_refused(unfinished: Path, moto_env: str) -> None:
    client = boto3.client("s3", endpoint_url=moto_env, region_name="us-east-1")
    client.create_bucket(Bucket="unfinished")
    for root, _dirs, files in os.walk(unfinished):
        for name in files:
            path = Path(root) / name
            key = f"ds/{path.relative_to(unfinished).as_posix()}"
            client.put_object(Bucket="unfinished", Key=key, Body=path.read_bytes())
    url = "s3://unfinished/ds"
    with pytest.raises(UnfinishedPackError, match="--resume"):
        fastload.ShardDataset(url)
    with pytest.raises(UnfinishedPackError, match="verified"):
        fastload.verify(url)
    proc = run_cli("index", url, AWS_ENDPOINT_URL=moto_env)
    assert proc.returncode == 1 and f"{url} holds an unfinished pack" in proc.stderr, proc.stderr
