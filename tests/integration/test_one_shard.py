"""`fastload verify` and `fastload inspect` take one shard, local or on S3: a shard listed by the index.json
of its folder (or a folder above) is checked against that index (its sample table included) or listed from its
sample table; a shard no index lists is linted / read once. Before, `verify s3://b/p/shard.tar` answered "no
index.json and no .tar or TFRecord files here" and `inspect shard.tar` a raw "Not a directory"."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import fastload
from fastload.testing.s3serve import S3Server

from .helpers import read_index, run_cli

BUCKET = "one"
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


@pytest.fixture
def bucket(rich_tree, tmp_path) -> Path:
    """``ds/``: a packed dataset; ``tars/``: copies of two of its shards without an index."""
    root = tmp_path / "bucket"
    fastload.pack(rich_tree.root, root / "ds", shard_size_bytes=16 << 10, progress=False)
    (root / "tars").mkdir()
    for shard in read_index(root / "ds")["shards"][:2]:
        shutil.copy(root / "ds" / shard["name"], root / "tars" / shard["name"])
    return root


@pytest.fixture
def served(bucket: Path) -> Iterator[dict[str, str]]:
    with S3Server(bucket, bucket=BUCKET) as server:
        yield {"AWS_ENDPOINT_URL": server.endpoint_url, **CREDS}


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_verify_takes_one_shard(bucket, served, where):
    shard = read_index(bucket / "ds")["shards"][1]

    def url(folder: str, name: str) -> str:
        return str(bucket / folder / name) if where == "local" else f"s3://{BUCKET}/{folder}/{name}"

    out = run_cli("verify", url("ds", shard["name"]), check=0, **served).stdout
    assert out.startswith("OK: 1 shards checked against index.json")
    assert f"{shard['samples']:,} samples" in out
    out = run_cli("verify", url("tars", shard["name"]), check=0, **served).stdout
    assert out.startswith("OK: 1 tar file(s) linted (no index.json)"), out
    _flip(bucket / "ds" / shard["name"], shard["offsets"][2] + 600)  # a data byte of its third sample
    out = run_cli("verify", url("ds", shard["name"]), check=1, **served).stdout
    assert f"{shard['name']}, sample {shard['keys'][2]!r}, byte offset {shard['offsets'][2]}" in out, out
    other = read_index(bucket / "ds")["shards"][0]["name"]
    assert run_cli("verify", url("ds", other), check=0, **served).stdout.startswith("OK")


@pytest.mark.parametrize("where", ["local", "s3"])
def test_inspect_takes_one_shard(bucket, served, where):
    shard = read_index(bucket / "ds")["shards"][1]

    def url(folder: str, name: str) -> str:
        return str(bucket / folder / name) if where == "local" else f"s3://{BUCKET}/{folder}/{name}"

    proc = run_cli("inspect", url("ds", shard["name"]), "--limit", "0", check=0, **served)
    assert "shard of the dataset" in proc.stdout and "Traceback" not in proc.stderr
    assert f"{shard['name']}: {shard['samples']} samples" in proc.stdout
    assert all(key in proc.stdout for key in shard["keys"])
    proc = run_cli("inspect", url("tars", shard["name"]), check=0, **served)
    assert "no index.json lists this file" in proc.stdout and shard["keys"][0] in proc.stdout
    assert f"{shard['samples']} samples" in proc.stdout


def test_inspect_of_a_file_that_is_no_shard_says_so(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    proc = run_cli("inspect", tmp_path / "notes.txt", check=2)
    assert "Not a directory" not in proc.stderr and "Traceback" not in proc.stderr
    assert "without an index.json" in proc.stderr, proc.stderr
