"""``fastload.MapDataset``: random access gives the samples iteration gives, for every index and format,
locally and from S3 (moto); a batch's neighbours in a shard are one ranged read (counted with s3_stats);
DataLoader workers under a DistributedSampler read every sample exactly once per epoch; damage is named."""

from __future__ import annotations

import contextlib
import pickle
import random
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch.utils.data
from botocore.config import Config

import fastload
from fastload import formats
from fastload.errors import VerifyError
from fastload.formats.tar.layout import layout_of

from .conftest import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, s3_env  # noqa: F401
from .helpers import WORKER_TIMEOUT_S, Packed, pack_files, small_files

FORMATS = ("tar", "parquet", "tfrecord")


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, uneven: Packed) -> dict[str, Packed]:
    """``uneven`` (tar, 7 shards) and the small samples as Parquet (row groups of ~2 samples) and TFRecord."""
    out = {"tar": uneven}
    for fmt in ("parquet", "tfrecord"):
        base = tmp_path_factory.mktemp(f"map-{fmt}")
        out[fmt] = pack_files(base, small_files(), max_samples=7, shard_format=fmt, row_group_bytes=2500)
    return out


@pytest.fixture(scope="module")
def iterated(packed: dict[str, Packed]) -> dict[str, list[dict[str, Any]]]:
    """Every dataset's samples as iteration gives them (index order, raw bytes)."""
    return {fmt: list(fastload.ShardDataset(p.root, decode=False)) for fmt, p in packed.items()}


def upload(moto_url: str, root: Path, prefix: str) -> str:
    """The dataset at ``root`` uploaded under s3://BUCKET/``prefix``; its URL."""
    client = boto3.client(
        "s3",
        endpoint_url=moto_url,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}),
    )
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)
    for path in sorted(q for q in root.rglob("*") if q.is_file() and not q.name.startswith(".")):
        key = f"{prefix}/{path.relative_to(root).as_posix()}"
        client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())
    client.close()
    return f"s3://{BUCKET}/{prefix}"


@pytest.fixture(scope="module")
def on_s3(moto_url: str, packed: dict[str, Packed]) -> dict[str, str]:
    """The three datasets uploaded under s3://BUCKET/map-<format>."""
    return {fmt: upload(moto_url, p.root, f"map-{fmt}") for fmt, p in packed.items()}


def s3_config(moto_url: str) -> fastload.S3Config:
    return fastload.S3Config(endpoint_url=moto_url, addressing_style="path", part_size_bytes=1 << 20)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_index_reads_what_iteration_gives(
    fmt: str, packed: dict[str, Packed], iterated: dict[str, list[dict[str, Any]]]
) -> None:
    expected = iterated[fmt]
    with fastload.MapDataset(packed[fmt].root, decode=False) as ds:
        assert len(ds) == len(expected) == len(packed[fmt].keys)
        assert [ds[i] for i in range(len(ds))] == expected
        order = list(range(len(ds)))
        random.Random(fmt).shuffle(order)
        assert ds.__getitems__(order) == [expected[i] for i in order]
        assert ds[-1] == expected[-1] and ds[-len(ds)] == expected[0]
        assert ds[3:11:2] == expected[3:11:2] and ds[[5, 5, 0]] == [expected[5], expected[5], expected[0]]
        assert ds.locate(len(ds) - 1) == (expected[-1]["__shard__"], expected[-1]["__index__"])


@pytest.mark.usefixtures("s3_env")
@pytest.mark.parametrize("fmt", FORMATS)
def test_s3_random_access_reads_what_iteration_gives(
    fmt: str, on_s3: dict[str, str], iterated: dict[str, list[dict[str, Any]]], moto_url: str
) -> None:
    expected = iterated[fmt]
    order = list(range(len(expected)))
    random.Random(1).shuffle(order)
    with fastload.MapDataset(on_s3[fmt], decode=False, s3_config=s3_config(moto_url)) as ds:
        half = order[: len(order) // 2]
        with ThreadPoolExecutor(8) as pool:  # ds[i] from many threads at once
            got = dict(zip(half, pool.map(ds.__getitem__, half), strict=True))
        got.update(zip(order[len(order) // 2 :], ds.__getitems__(order[len(order) // 2 :]), strict=True))
    assert [got[i] for i in range(len(expected))] == expected


def test_decoding_and_map_as_shard_dataset(packed: dict[str, Packed]) -> None:
    def label(s: dict[str, Any]) -> tuple[str, int, str]:
        return s["__key__"], s["cls"], s["txt"]

    iterated = list(fastload.ShardDataset(packed["tar"].root, map=label))
    ds = fastload.MapDataset(packed["tar"].root, map=label)
    assert ds[:] == iterated and isinstance(iterated[0][1], int)
    pq = fastload.MapDataset(packed["parquet"].root, columns=["cls"], decode=False)
    assert set(pq[4]) == {"__key__", "__index__", "__shard__", "cls"}
    with pytest.raises(fastload.errors.ConfigError, match="columns= projects Parquet"):
        fastload.MapDataset(packed["tar"].root, columns=["cls"])


def test_on_error_skip_leaves_a_sample_out_of_a_batch(packed: dict[str, Packed]) -> None:
    keys = packed["tar"].keys

    def picky(s: dict[str, Any]) -> str:
        if s["__key__"] == keys[7]:
            raise ValueError("not this one")
        return str(s["__key__"])

    ds = fastload.MapDataset(packed["tar"].root, map=picky, on_error="skip")
    assert ds.__getitems__([6, 7, 8]) == [keys[6], keys[8]] and ds.skipped == 1
    with pytest.raises(fastload.errors.FastloadError, match="not this one"):
        ds[7]


@pytest.mark.usefixtures("s3_env")
def test_a_batch_reads_each_shards_neighbours_with_one_request(
    packed: dict[str, Packed], on_s3: dict[str, str], moto_url: str
) -> None:
    tar = packed["tar"]  # shards of 40, 1, 7, 3, 13, 9, 22 samples: 0-39, 40, 41-47, ...
    ds = fastload.MapDataset(on_s3["tar"], decode=False, s3_config=s3_config(moto_url), max_gap_bytes=0)
    ds.__getitems__([0, 44])  # the two shards' tables fetched and their objects' sizes learnt
    fastload.s3_stats(reset=True)
    batch = ds.__getitems__([3, 42, 5, 4, 43, 41])  # runs 3..5 and 41..43: one GET each
    assert fastload.s3_stats()["requests"] == 2
    assert [s["__key__"] for s in batch] == [tar.keys[i] for i in (3, 42, 5, 4, 43, 41)]
    fastload.s3_stats(reset=True)
    ds.__getitems__([10, 12])  # a sample between: two reads without a gap allowance...
    assert fastload.s3_stats()["requests"] == 2
    gapped = fastload.MapDataset(on_s3["tar"], decode=False, s3_config=s3_config(moto_url))
    gapped[0]
    fastload.s3_stats(reset=True)
    assert [s["__key__"] for s in gapped.__getitems__([12, 10])] == [tar.keys[12], tar.keys[10]]
    assert fastload.s3_stats()["requests"] == 1  # ...one with it (the default, 256 KiB)
    # Parquet: one GET per row group (its footer once per shard), neighbours from the kept group
    pq = fastload.MapDataset(on_s3["parquet"], decode=False, s3_config=s3_config(moto_url))
    pq[0]
    fastload.s3_stats(reset=True)
    pq[1], pq[2], pq[3]
    entry = formats.full_entry(str(packed["parquet"].root), pq.index.shards[0], shard_format="parquet")
    groups_touched = len({g for g, n in enumerate(_group_of(entry, [0, 1, 2, 3])) if n}) - 1
    assert fastload.s3_stats()["requests"] == groups_touched
    ds.close(), gapped.close(), pq.close()


def _group_of(entry: Any, positions: list[int]) -> list[int]:
    """How many of ``positions`` fall in each row group of ``entry``."""
    counts, start = [], 0
    for _, _, rows in entry.row_groups:
        counts.append(sum(start <= p < start + rows for p in positions))
        start += rows
    return counts


@pytest.mark.usefixtures("s3_env")
def test_distributed_sampler_with_workers_reads_each_sample_once_per_epoch(
    packed: dict[str, Packed], on_s3: dict[str, str], moto_url: str
) -> None:
    ds = fastload.MapDataset(on_s3["tfrecord"], decode=False, s3_config=s3_config(moto_url))
    ds[0]  # the parent has open shards: workers must open their own
    assert len(pickle.dumps(ds)) < 8_000
    keys: dict[int, list[str]] = {0: [], 1: []}
    for rank in (0, 1):
        sampler = torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=7)
        loader = torch.utils.data.DataLoader(
            ds,
            batch_size=4,
            sampler=sampler,
            num_workers=2,
            collate_fn=list,
            persistent_workers=True,
            timeout=WORKER_TIMEOUT_S,
        )
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            keys[epoch] += [s["__key__"] for batch in loader for s in batch]
    epochs = [keys[0], keys[1]]
    for epoch_keys in epochs:
        assert sorted(epoch_keys) == sorted(packed["tfrecord"].keys)  # 30 samples: each exactly once
    assert epochs[0] != epochs[1]


def test_shuffle_and_weighted_sampler(packed: dict[str, Packed]) -> None:
    tar = packed["tar"]
    ds = fastload.MapDataset(tar.root, decode=False)
    weights = [0.0] * len(ds)
    for i in (2, 40, 94):
        weights[i] = 1.0
    sampler = torch.utils.data.WeightedRandomSampler(
        weights, num_samples=12, generator=torch.Generator().manual_seed(0)
    )
    loader = torch.utils.data.DataLoader(ds, batch_size=6, sampler=sampler, collate_fn=list)
    keys = {s["__key__"] for batch in loader for s in batch}
    assert keys <= {tar.keys[2], tar.keys[40], tar.keys[94]} and len(keys) > 1
    shuffled = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, collate_fn=list)
    assert sorted(s["__key__"] for b in shuffled for s in b) == sorted(tar.keys)


def test_index_errors(packed: dict[str, Packed]) -> None:
    ds = fastload.MapDataset(packed["tar"].root, decode=False)
    with pytest.raises(IndexError, match="sample index 95 is out of range for a dataset of 95 samples"):
        ds[95]
    with pytest.raises(IndexError, match="-96 is out of range"):
        ds.__getitems__([0, -96])
    with pytest.raises(TypeError):
        ds[1.5]  # type: ignore[index]
    assert ds[95:200] == [] and ds.__getitems__([]) == []
    assert ds[torch.tensor(94)] == ds[94] and ds[torch.tensor([94, 0])] == [ds[94], ds[0]]
    assert list(iter(ds))[-1]["__key__"] == packed["tar"].keys[-1]  # (the old sequence protocol too)


def damage(root: Path, index: int) -> tuple[str, int]:
    """Flip a byte in the middle of sample ``index``'s ``bin`` data; ``(shard, the sample's offset)``."""
    ds = fastload.MapDataset(root, decode=False)
    shard, position = ds.locate(index)
    (entry,) = [
        formats.full_entry(str(root), e, shard_format="tar") for e in ds.index.shards if e.name == shard
    ]
    at = entry.offsets[position] + 512  # the first member's data
    layout = layout_of(entry)
    assert layout is not None
    for field, size in zip(layout.fields, layout.sizes[position], strict=True):
        if field == "bin":
            at += size // 2
            break
        at += 512 + (size + 511) // 512 * 512
    with open(root / shard, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    return shard, entry.offsets[position]


@pytest.fixture(scope="module")
def damaged(packed: dict[str, Packed], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int]:
    """A copy of the tar dataset whose sample 43 has a flipped data byte: ``(root, shard, offset)``."""
    root = tmp_path_factory.mktemp("damaged") / "ds"
    shutil.copytree(packed["tar"].root, root)
    return (root, *damage(root, 43))


def test_a_damaged_sample_is_named(packed: dict[str, Packed], damaged: tuple[Path, str, int]) -> None:
    tar = packed["tar"]
    root, shard, offset = damaged
    ds = fastload.MapDataset(root, decode=False)
    with pytest.raises(VerifyError) as caught:
        ds[43]
    err = caught.value
    assert (err.shard, err.key, err.offset) == (shard, tar.keys[43], offset)
    with pytest.raises(VerifyError):
        ds.__getitems__([42, 43, 44])
    assert ds[42]["__key__"] == tar.keys[42]  # its neighbours are fine
    unchecked = fastload.MapDataset(root, decode=False, verify_samples=False)
    assert unchecked[43]["bin"] != tar.samples[tar.keys[43]]["bin"]


@pytest.mark.usefixtures("s3_env")
def test_a_damaged_sample_on_s3_is_named(
    packed: dict[str, Packed], damaged: tuple[Path, str, int], moto_url: str
) -> None:
    url = upload(moto_url, damaged[0], "map-damaged")
    ds = fastload.MapDataset(url, decode=False, s3_config=s3_config(moto_url))
    with pytest.raises(VerifyError) as caught:
        ds.__getitems__([44, 43])
    assert (caught.value.shard, caught.value.key, caught.value.offset) == (
        damaged[1],
        packed["tar"].keys[43],
        damaged[2],
    )
    assert ds[44]["__key__"] == packed["tar"].keys[44]


@pytest.mark.usefixtures("s3_env")
def test_shard_cache(packed: dict[str, Packed], on_s3: dict[str, str], moto_url: str, tmp_path: Path) -> None:
    expected = list(fastload.ShardDataset(packed["tar"].root, decode=False))
    cache = tmp_path / "cache"
    ds = fastload.MapDataset(
        on_s3["tar"], decode=False, s3_config=s3_config(moto_url), cache_dir=cache, max_open_shards=1
    )
    assert ds.__getitems__([94, 0, 50]) == [expected[94], expected[0], expected[50]]
    fastload.s3_stats(reset=True)
    assert ds[1] == expected[1] and fastload.s3_stats()["requests"] == 0  # shard 0 is on disk
    assert len(list(cache.iterdir())) > 3
    (copy,) = [p for p in cache.iterdir() if p.name.endswith("shard-000000.tar")]
    entry = formats.full_entry(str(packed["tar"].root), ds.index.shards[0], shard_format="tar")
    damaged = bytearray(copy.read_bytes())
    damaged[entry.offsets[39] + 512] ^= 0xFF  # sample 39's first member's first byte
    copy.write_bytes(bytes(damaged))
    assert ds[50] == expected[50]  # (only one shard is kept open: shard 0 is closed)
    fastload.s3_stats(reset=True)  # shard 0 opens again, unchecked (this process checked it once)
    assert ds[39] == expected[39] and fastload.s3_stats()["requests"] > 0  # damage found, shard fetched
