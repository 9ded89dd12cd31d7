"""Foreign Parquet files under an ``s3://`` prefix (moto): read directly with an index from their footers
(one LIST, then one ranged GET of each file's tail: counted), then indexed with
``fastload index`` and read without a warning."""

from __future__ import annotations

import json
import warnings

import boto3
import pytest
from botocore.config import Config
from conftest import Hive
from dataset.test_s3 import ACCESS_KEY, REGION, SECRET_KEY, s3_env  # noqa: F401 (s3_env is a fixture)

import fastload
from fastload.packing.indexing import build_index
from fastload.stats import s3_stats
from fastload.train.source import open_index

BUCKET = "fastload-parquet-foreign"


@pytest.mark.usefixtures("s3_env")
def test_an_s3_prefix_of_foreign_parquet(hive: Hive, moto_url: str) -> None:
    client = boto3.client(
        "s3",
        endpoint_url=moto_url,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}),
    )
    client.create_bucket(Bucket=BUCKET)
    for path in sorted(p for p in hive.root.rglob("*") if p.is_file()):
        client.put_object(
            Bucket=BUCKET, Key=f"ev/{path.relative_to(hive.root).as_posix()}", Body=path.read_bytes()
        )
    config = fastload.S3Config(endpoint_url=moto_url, addressing_style="path", part_size_bytes=64 << 10)
    url = f"s3://{BUCKET}/ev"

    s3_stats(reset=True)
    with pytest.warns(UserWarning, match="footers of 3 Parquet file"):
        root, index = open_index(url, s3_config=config, key_column="id")
    stats = s3_stats()
    sizes = sum(s.bytes for s in index.shards)
    assert root == url and index.samples == 15
    assert (
        stats["requests"] <= 2 + 3 + 3
    )  # LIST (x2: the index.json probe's), a GET per footer, one per key chunk
    assert stats["bytes"] <= sizes  # never more than the files (each file here is < 64 KiB: its tail is it)

    with pytest.warns(UserWarning, match="no index.json"):
        ds = fastload.ShardDataset(url, decode=False, s3_config=config, seed=3)
    got = {s["__key__"]: s for s in ds}
    assert sorted(got) == sorted(hive.rows)
    assert all(got[k]["jpg"] == row["jpg"] and got[k]["id"] == row["id"] for k, row in hive.rows.items())

    report = build_index(url, s3_config=config, key_column="id")
    assert report.ok, report.summary()
    manifest = json.loads(client.get_object(Bucket=BUCKET, Key="ev/index.json")["Body"].read())
    assert [s["partition"] for s in manifest["shards"]] == list(hive.partitions.values())
    client.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        samples = list(fastload.ShardDataset(url, decode=False, s3_config=config, columns=["label"]))
    assert [s["__key__"] for s in samples] == [r["id"] for r in hive.rows.values()]
    assert fastload.verify(url, s3_config=config).ok
