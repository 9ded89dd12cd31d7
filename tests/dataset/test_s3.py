"""A packed dataset read from S3 (moto on loopback) by DataLoader workers: the same samples, bytes and order
as the same dataset on local disk."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.config import Config

import fastload

from .conftest import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, s3_env  # noqa: F401 (tests/tfrecord imports s3_env here)
from .helpers import Packed, make_loader, pack_files, small_files


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
