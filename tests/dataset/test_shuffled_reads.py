"""A sample shuffle over a Parquet (``pack-tokens``) dataset reads each row group about once per epoch, from
local disk and from S3 (moto), in the same order as before: the samples a row group read brings for later
turns wait for them (``PrefetchConfig.hold_bytes``) instead of the row group being read again per sample."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.config import Config

import fastload
from fastload.train.options import PrefetchConfig

from .conftest import ACCESS_KEY, REGION, SECRET_KEY, s3_env  # noqa: F401

SHUFFLE = {"seed": 3, "shuffle_buffer": 300}  # a buffer spanning many row groups, as docs/tokens.md says
OFF = PrefetchConfig(hold_bytes=0)  # each read for its own run of references, as before holding


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,200 documents of 20-700 uint16 tokens (about 0.9 MB) in 3 shards of 16 KiB row groups."""
    base = tmp_path_factory.mktemp("shuffled")
    rng = np.random.default_rng(7)
    lens = rng.integers(20, 700, 1200)
    offsets = np.concatenate(([0], np.cumsum(lens)))
    values = pa.array(rng.integers(0, 50_257, int(offsets[-1]), dtype=np.int64))
    pq.write_table(
        pa.table({"ids": pa.LargeListArray.from_arrays(pa.array(offsets), values)}), base / "a.parquet"
    )
    fastload.pack_tokens(
        base / "a.parquet",
        base / "ds",
        column="ids",
        vocab_size=50_257,
        shard_size_bytes=320 << 10,
        row_group_bytes=16 << 10,
    )
    return base / "ds"


def proc_read_bytes() -> int:
    """Bytes this process has read with read()/pread() so far (Linux's /proc/self/io ``rchar``)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def epoch(source: Any, **kw: Any) -> list[tuple[str, bytes]]:
    return [(s["__key__"], s["tokens.u16"]) for s in fastload.ShardDataset(source, decode=False, **kw)]


def read_bytes_of(source: Any, **kw: Any) -> tuple[list[tuple[str, bytes]], int]:
    before = proc_read_bytes()
    samples = epoch(source, **kw)
    return samples, proc_read_bytes() - before


def test_a_shuffled_epoch_reads_each_row_group_about_once(tokens: Path) -> None:
    shards = sorted(tokens.glob("*.parquet"))
    assert len(shards) >= 3 and sum(p.stat().st_size for p in shards) > (800 << 10)
    _, plain = read_bytes_of(tokens)
    shuffled, nbytes = read_bytes_of(tokens, **SHUFFLE)
    # (was 14x: a row group read for almost every document)
    assert nbytes <= 2 * plain, f"a shuffled epoch read {nbytes:,} bytes, an unshuffled one {plain:,}"
    # the order is the one every checkpoint means: as reading each run of references on its own gives it
    assert shuffled == epoch(tokens, **SHUFFLE, prefetch=OFF)
    assert sorted(shuffled) == sorted(epoch(tokens))
    assert [k for k, _ in shuffled] != sorted(k for k, _ in shuffled)


@pytest.mark.parametrize("hold_bytes", [1, 40 << 10])
def test_little_room_to_hold_keeps_order_and_reads_more(tokens: Path, hold_bytes: int) -> None:
    """The bound holds the samples read ahead to at most ``hold_bytes`` (below one sample: none), and the
    order never depends on it."""
    want = epoch(tokens, **SHUFFLE, prefetch=OFF)
    got, nbytes = read_bytes_of(tokens, **SHUFFLE, prefetch=PrefetchConfig(hold_bytes=hold_bytes))
    assert got == want
    _, roomy = read_bytes_of(tokens, **SHUFFLE)
    assert nbytes > roomy


def test_order_resume_and_workers_are_unchanged(tokens: Path) -> None:
    """Through fastload.DataLoader workers (references dealt in batches) and a resume mid-epoch: the samples
    of an uninterrupted single-process epoch, in its order."""
    want = [k for k, _ in epoch(tokens, **SHUFFLE, prefetch=OFF)]

    def loader(workers: int) -> fastload.DataLoader:
        ds = fastload.ShardDataset(tokens, decode=False, **SHUFFLE)
        return fastload.DataLoader(ds, batch_size=50, collate_fn=list, num_workers=workers)

    assert [s["__key__"] for b in loader(2) for s in b] == want
    first = loader(2)
    it = iter(first)
    head = [s["__key__"] for _, b in zip(range(7), it, strict=False) for s in b]
    state = first.state_dict()
    del it
    again = loader(0)
    again.load_state_dict(state)
    assert head + [s["__key__"] for b in again for s in b] == want


BUCKET = "fastload-shuffled-reads"


@pytest.mark.usefixtures("s3_env")
def test_s3_gets_per_shuffled_epoch_are_about_the_row_groups(tokens: Path, moto_url: str) -> None:
    client = boto3.client(
        "s3",
        endpoint_url=moto_url,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}),
    )
    client.create_bucket(Bucket=BUCKET)
    for path in sorted(p for p in tokens.rglob("*") if p.is_file()):  # (Parquet's _fastload/ too)
        client.put_object(
            Bucket=BUCKET, Key=f"tok/{path.relative_to(tokens).as_posix()}", Body=path.read_bytes()
        )
    client.close()
    url = f"s3://{BUCKET}/tok"
    config = fastload.S3Config(endpoint_url=moto_url, addressing_style="path")
    shards = sorted(tokens.glob("*.parquet"))
    groups = sum(pq.ParquetFile(p).num_row_groups for p in shards)
    fastload.s3_stats(reset=True)
    assert epoch(url, s3_config=config) == epoch(tokens)
    plain = fastload.s3_stats(reset=True)
    assert epoch(url, s3_config=config, **SHUFFLE) == epoch(tokens, **SHUFFLE)
    shuffled = fastload.s3_stats(reset=True)
    # a GET per row group read, plus index.json and each shard's table (was about one per document: 1,200)
    assert shuffled["requests"] <= groups + 1 + len(shards) + 5, (shuffled["requests"], groups)
    assert shuffled["bytes"] <= 2 * plain["bytes"], (shuffled["bytes"], plain["bytes"])
