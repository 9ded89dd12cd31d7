"""Foreign Parquet files under an ``s3://`` prefix (moto): read directly with an index from their footers
(one LIST, then one ranged GET of each file's tail: counted), then indexed with
``fastload index`` and read without a warning."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from dataset.test_s3 import ACCESS_KEY, REGION, SECRET_KEY, s3_env  # noqa: F401 (s3_env is a fixture)
from pqf_helpers import Hive

import fastload
from fastload.packing.indexing import build_index
from fastload.stats import s3_stats
from fastload.train.source import open_index

BUCKET = "fastload-parquet-foreign"


@pytest.mark.usefixtures("s3_env")
def test_an_s3_prefix_of_foreign_parquet(hive: Hive, moto_url: str, tmp_path: Path) -> None:
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
        for prefix in ("ev", "spark.parquet"):  # (Spark names a dataset's folder like a file)
            client.put_object(
                Bucket=BUCKET,
                Key=f"{prefix}/{path.relative_to(hive.root).as_posix()}",
                Body=path.read_bytes(),
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

    with pytest.warns(UserWarning, match="footers of 3 Parquet file"):
        assert open_index(f"s3://{BUCKET}/spark.parquet", s3_config=config)[1].samples == 15
    with pytest.warns(UserWarning, match="no index.json"):  # (no CRC32C: the cache checks sizes)
        ds = fastload.ShardDataset(url, decode=False, s3_config=config, seed=3, cache_dir=tmp_path / "cache")
    got = {s["__key__"]: s for s in ds}
    assert sorted(got) == sorted(hive.rows)
    assert all(got[k]["jpg"] == row["jpg"] and got[k]["id"] == row["id"] for k, row in hive.rows.items())

    report = build_index(url, s3_config=config, key_column="id")
    assert report.ok, report.summary()
    manifest = json.loads(client.get_object(Bucket=BUCKET, Key="ev/_fastload/index.json")["Body"].read())
    assert [s["partition"] for s in manifest["shards"]] == list(hive.partitions.values())
    client.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        samples = list(fastload.ShardDataset(url, decode=False, s3_config=config, columns=["label"]))
    assert [s["__key__"] for s in samples] == [r["id"] for r in hive.rows.values()]
    assert fastload.verify(url, s3_config=config).ok


@pytest.mark.usefixtures("s3_env")
def test_pack_a_manifest_on_s3(moto_url: str, tmp_path: Path) -> None:
    """A CSV manifest and the images it names under an S3 prefix, packed to a local folder."""
    client = boto3.client(
        "s3",
        endpoint_url=moto_url,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}),
    )
    client.create_bucket(Bucket=BUCKET + "-m")
    lines = ["path,label"] + [f"img/{i}.png,{i % 3}" for i in range(5)]
    client.put_object(Bucket=BUCKET + "-m", Key="m/manifest.csv", Body="\n".join(lines).encode())
    for i in range(5):
        client.put_object(Bucket=BUCKET + "-m", Key=f"m/img/{i}.png", Body=bytes([i]) * (10 + i))
    client.close()
    config = fastload.S3Config(endpoint_url=moto_url, addressing_style="path")
    report = fastload.pack(
        f"s3://{BUCKET}-m/m/manifest.csv",
        tmp_path / "out",
        s3_config=config,
        shard_format="parquet",
        file_columns=["path=png"],
        sort_by="label",
        progress=False,
    )
    assert report.index.samples == 5 and report.files == 5
    samples = list(fastload.ShardDataset(tmp_path / "out", decode=False))
    assert [s["label"] for s in samples] == [0, 0, 1, 1, 2]
    assert all(s["png"] == bytes([int(s["path"][4])]) * (10 + int(s["path"][4])) for s in samples)
