"""A packed dataset read from S3 (moto on loopback) by DataLoader workers: the same samples, bytes and order
as the same dataset on local disk."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

import fastload
from fastload.s3 import runtime
from fastload.testing.s3serve import S3Server

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
def uploaded_parquet(
    moto_url: str, uploaded: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Packed, str]:
    """``small_files`` packed as Parquet under s3://BUCKET/pq (the bucket ``uploaded`` made)."""
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
    # a copy with one byte of one shard flipped (its size, index and tables kept)
    shard = packed.index["shards"][1]["name"]
    for path in sorted(p for p in packed.root.rglob("*") if p.is_file()):
        rel = path.relative_to(packed.root).as_posix()
        data = bytearray(path.read_bytes())
        if rel == shard:
            data[len(data) // 2] ^= 0xFF
        client.put_object(Bucket=BUCKET, Key=f"pq-damaged/{rel}", Body=bytes(data))
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


@pytest.mark.usefixtures("s3_env")
def test_s3_parquet_shards_read_whole_are_one_get_without_their_tables(
    uploaded_parquet: tuple[Packed, str], moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task that reads every row and column of a Parquet shard fetches the shard in one GET and no sample
    table (the entry comes from the shard's bytes, checked against index.json's CRC32C); a projected or
    shuffled read still fetches tables; the samples are the local dataset's, in the same order, either way.
    A shard whose bytes changed is refused, named."""
    from collections import Counter

    from fastload.errors import VerifyError
    from fastload.storage import access

    packed, url = uploaded_parquet
    config = fastload.S3Config(endpoint_url=moto_url, addressing_style="path")
    fetched: Counter[str] = Counter()
    read_bytes = access.read_bytes

    def counting(where: str, **kw: Any) -> bytes:
        fetched[where.rsplit(".", 1)[-1]] += 1
        return read_bytes(where, **kw)

    monkeypatch.setattr(access, "read_bytes", counting)
    shards = len(packed.index["shards"])

    def read(source: Any, **kw: Any) -> list[dict[str, Any]]:
        fetched.clear()
        return list(fastload.ShardDataset(source, decode=False, **kw))

    for kw in ({}, {"seed": 4}):  # in order; shuffled shard by shard (a shard's run is all its rows)
        local = read(packed.root, **kw)
        assert read(url, s3_config=config, **kw) == local
        assert (fetched["parquet"], fetched["fltable"]) == (shards, 0)
    local = read(packed.root, seed=4, shuffle_buffer=8)  # runs of a shard interleave: tables fetched
    assert read(url, s3_config=config, seed=4, shuffle_buffer=8) == local
    # (each shard is one row group here, read once for all its samples: so one GET of the whole shard)
    assert fetched["fltable"] == shards and fetched["parquet"] == shards
    assert read(url, s3_config=config, columns=["cls"]) == read(packed.root, columns=["cls"])
    with pytest.raises(VerifyError, match="CRC32C") as raised:
        read(f"s3://{BUCKET}/pq-damaged", s3_config=config)
    assert raised.value.shard == packed.index["shards"][1]["name"]


@pytest.mark.usefixtures("s3_env")
@pytest.mark.parametrize("persistent", [False, True])
def test_s3_stats_in_the_loop_include_the_workers_requests(
    uneven: Packed, tmp_path: Path, persistent: bool
) -> None:
    """Issue 28 item 17: after 2 epochs with ``num_workers=2``, ``fastload.s3_stats()`` in the training
    process showed only its own requests (index.json); the workers' counts now arrive with their batches,
    so requests and bytes equal what the server answered."""
    root = tmp_path / "bucket"
    shutil.copytree(uneven.root, root / "ds")
    with S3Server(root, bucket="stats") as server:
        config = fastload.S3Config(
            endpoint_url=server.endpoint_url, addressing_style="path", part_size_bytes=64 << 10, hedge=0
        )
        runtime.reset()
        _, dl = make_loader(
            "s3://stats/ds",
            batch_size=4,
            num_workers=2,
            loader={"collate_fn": list, "persistent_workers": persistent},
            decode=False,
            seed=1,
            s3_config=config,
        )
        keys = [s["__key__"] for _ in range(2) for batch in dl for s in batch]
        served = server.stats()
        del dl
    assert sorted(keys) == sorted(uneven.keys * 2)
    stats = fastload.s3_stats()
    answered = sum(served.requests.values())
    assert answered > 10  # the workers' shard and table reads, not only index.json
    assert stats["requests"] == answered, (stats, served)
    assert stats["bytes"] == served.body_bytes, (stats, served)
    assert stats["first_byte_latency"]["p50_ms"] is not None
