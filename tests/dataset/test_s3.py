"""A packed dataset read from S3 (moto on loopback) by DataLoader workers: the same samples, bytes and order
as the same dataset on local disk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

import fastload
from fastload.s3 import runtime

from .helpers import Packed, make_loader, pack_files, small_files

BUCKET = "fastload-dataset-tests"
REGION = "us-east-1"
ACCESS_KEY, SECRET_KEY = "AKIDDATASETTESTS", "dataset-tests-secret"


@pytest.fixture(scope="module")
def uploaded(moto_url: str, uneven: Packed) -> str:
    """``uneven`` uploaded as is (shards and index.json) under s3://BUCKET/ds."""
    client = boto3.client(
        "s3",
        endpoint_url=moto_url,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}),
    )
    client.create_bucket(Bucket=BUCKET)
    for path in sorted(p for p in uneven.root.rglob("*") if p.is_file()):
        rel = path.relative_to(uneven.root).as_posix()
        if not rel.startswith("."):
            client.put_object(Bucket=BUCKET, Key=f"ds/{rel}", Body=path.read_bytes())
    client.close()
    return f"s3://{BUCKET}/ds"


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Dummy credentials in the environment (inherited by forked workers), nothing from this machine's AWS
    configuration; afterwards the S3 clients fastload cached in this process are closed."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield
    runtime.reset()


def samples(source: Any, **kw: Any) -> list[dict[str, Any]]:
    _, dl = make_loader(source, batch_size=4, loader={"collate_fn": list}, decode=False, **kw)
    return [s for batch in dl for s in batch]


@pytest.mark.usefixtures("s3_env")
def test_s3_dataset_reads_like_the_local_one(uneven: Packed, uploaded: str, moto_url: str) -> None:
    config = fastload.S3Config(endpoint_url=moto_url, addressing_style="path", part_size_bytes=64 << 10)
    kw = {"seed": 3, "shuffle_buffer": 16}
    remote = samples(uploaded, num_workers=2, s3_config=config, **kw)
    local = samples(uneven, **kw)
    assert [s["__key__"] for s in remote] == [s["__key__"] for s in local]
    assert remote == local
    assert sorted(s["__key__"] for s in remote) == sorted(uneven.keys)
    for s in remote:
        assert {k: v for k, v in s.items() if not k.startswith("__")} == uneven.samples[s["__key__"]]


@pytest.fixture(scope="module")
def uploaded_parquet(moto_url: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Packed, str]:
    packed = pack_files(
        tmp_path_factory.mktemp("s3parquet"), small_files(), max_samples=7, shard_format="parquet"
    )
    client = boto3.client(
        "s3",
        endpoint_url=moto_url,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}),
    )
    for path in sorted(p for p in packed.root.rglob("*") if p.is_file()):
        rel = path.relative_to(packed.root).as_posix()
        if not rel.startswith("."):
            client.put_object(Bucket=BUCKET, Key=f"pq/{rel}", Body=path.read_bytes())
    client.close()
    return packed, f"s3://{BUCKET}/pq"


@pytest.mark.usefixtures("s3_env")
def test_s3_parquet_columns(uploaded_parquet: tuple[Packed, str], moto_url: str) -> None:
    packed, url = uploaded_parquet
    config = fastload.S3Config(endpoint_url=moto_url, addressing_style="path")
    remote = samples(url, num_workers=2, s3_config=config, columns=["bin"], seed=2)
    assert sorted(s["__key__"] for s in remote) == sorted(packed.keys)
    for s in remote:
        assert set(s) == {"__key__", "__shard__", "__index__", "bin"}
        assert s["bin"] == packed.samples[s["__key__"]]["bin"]
