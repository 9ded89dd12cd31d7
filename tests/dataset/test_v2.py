"""Reading an index v2 dataset (shards listed in index.json, each shard's sample table in a sidecar): the same
samples as its v1 form, locally, over S3 (a loopback S3 endpoint serving the folder) and through the cache;
each table fetched once per shard per pass and let go when the shard is done; every sample's bytes checked
against its CRC32C (a flipped data byte raises VerifyError naming shard, key and offset, the cache heals a
damaged copy, ``verify_samples=False`` reads the bytes as they are); a missing or damaged sidecar named."""

from __future__ import annotations

import json
import shutil
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload.core.index import ShardEntry
from fastload.errors import FastloadError, NotFoundError, VerifyError
from fastload.formats import native
from fastload.formats.tar.layout import layout_of
from fastload.packing.upgrade import upgrade_index
from fastload.storage import tables
from fastload.testing.s3serve import S3Server
from fastload.train.shardread import TABLES_AHEAD

from .conftest import s3_env  # noqa: F401 (a fixture)
from .helpers import Packed, make_loader, pack_files, small_files

BUCKET = "v2"


def to_v2(packed: Packed, dst: Path) -> Path:
    """A copy of ``packed`` upgraded to index v2 (what `fastload index --upgrade` writes)."""
    shutil.copytree(packed.root, dst)

    def manifest() -> Path:  # (Parquet datasets keep it in _fastload/)
        return dst / "index.json" if (dst / "index.json").exists() else dst / "_fastload" / "index.json"

    index = json.loads(manifest().read_bytes())
    if index["version"] == 1:  # (pack may write v2 itself)
        upgrade_index(str(dst))
    index = json.loads(manifest().read_bytes())
    assert index["version"] == 2 and all("table" in s and "keys" not in s for s in index["shards"])
    return dst


@pytest.fixture(scope="module")
def v2(uneven: Packed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return to_v2(uneven, tmp_path_factory.mktemp("v2") / "ds")


def read(source: Any, **kw: Any) -> list[dict[str, Any]]:
    return list(fastload.ShardDataset(source, decode=False, **kw))


def data_byte(root: Path, shard: int, sample: int) -> tuple[str, str, int, int]:
    """``(shard name, key, sample offset, absolute position of a byte of its last member's data)``."""
    entry = fastload.ShardDataset(root).index.shards[shard]
    from fastload import formats

    full = formats.full_entry(str(root), entry, shard_format="tar")
    offset, size = full.offsets[sample], full.sizes[sample]
    layout = layout_of(full)
    assert layout is not None
    last = layout.sizes[sample][-1]
    data_end = offset + size - ((512 - last % 512) % 512)
    return full.name, full.keys[sample], offset, data_end - max(1, last // 2)


def flip(path: Path, at: int) -> bytes:
    good = path.read_bytes()
    data = bytearray(good)
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    return good


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"prefetch_bytes": 1 << 20},
        {"seed": 3, "shuffle_buffer": 16},
        {"seed": 1, "rank": 1, "world_size": 2},
    ],
)
def test_v2_reads_the_samples_of_v1(uneven: Packed, v2: Path, kw: dict[str, Any]) -> None:
    old, new = read(uneven.root, **kw), read(v2, **kw)
    assert [s["__key__"] for s in new] == [s["__key__"] for s in old]
    assert new == old
    if not kw:
        assert sorted(s["__key__"] for s in new) == sorted(uneven.keys)


def test_v2_with_dataloader_workers(uneven: Packed, v2: Path) -> None:
    def keys(root: Path) -> list[list[str]]:
        _, dl = make_loader(str(root), batch_size=5, num_workers=2, seed=4, decode=False)
        return [list(b["__key__"]) for b in dl]

    assert keys(v2) == keys(uneven.root)


def test_the_python_readers_check_crcs_too(v2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = read(v2, prefetch_bytes=0)
    monkeypatch.setattr(native, "layout_run", None)
    assert read(v2, prefetch_bytes=0) == expected


class Tracked:
    """Counts table fetches and the full entries still alive."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fetched: list[str] = []
        self.live: list[weakref.ref[ShardEntry]] = []
        real = tables.fetch_table

        def fetch(root: str, entry: ShardEntry, **kw: Any) -> ShardEntry:
            full = real(root, entry, **kw)
            self.fetched.append(entry.name)
            self.live.append(weakref.ref(full))
            return full

        monkeypatch.setattr(tables, "fetch_table", fetch)

    def alive(self) -> int:
        return sum(r() is not None for r in self.live)


@pytest.mark.parametrize(("prefetch", "bound"), [(0, 1), (1 << 16, 2 + TABLES_AHEAD)])
def test_each_table_is_fetched_once_and_let_go_after_its_shard(
    v2: Path, monkeypatch: pytest.MonkeyPatch, prefetch: int, bound: int
) -> None:
    """Without tables kept between epochs (``cache_tables_bytes=0``), at most ``bound`` tables alive at
    once: the shard being read; with prefetch also the shard of the task fetched ahead and the next
    ``TABLES_AHEAD`` shards' tables, fetched ahead (64 KiB holds about one task here)."""
    tracked = Tracked(monkeypatch)
    ds = fastload.ShardDataset(v2, decode=False, prefetch_bytes=prefetch, seed=2, cache_tables_bytes=0)
    most = 0
    for _ in ds:
        most = max(most, tracked.alive())
    assert sorted(tracked.fetched) == sorted(s.name for s in ds.index.shards)  # once per shard
    assert most <= bound < len(ds.index.shards)
    assert tracked.alive() == 0
    assert list(ds) and len(tracked.fetched) == 2 * len(ds.index.shards)  # each epoch fetches them again


def test_tables_are_kept_between_epochs_within_their_budget(
    v2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default a process keeps the tables it read (least recently used dropped past
    ``cache_tables_bytes``): later epochs, in any order, fetch none and read the same samples; a budget
    smaller than all tables keeps the newest within it alive and no others."""
    from fastload.train.tablememo import entry_weight

    tracked = Tracked(monkeypatch)
    ds = fastload.ShardDataset(v2, decode=False, seed=2)
    names = sorted(s.name for s in ds.index.shards)
    first = list(ds)
    ds.set_epoch(1)
    second = list(ds)
    assert sorted(tracked.fetched) == names  # once per shard, over both epochs
    assert sorted(s["__key__"] for s in second) == sorted(s["__key__"] for s in first) and second != first
    memo = ds.table_memo()
    assert memo is not None and len(memo) == len(names) and memo.hits == len(names)
    fresh = fastload.ShardDataset(v2, decode=False, seed=2, cache_tables_bytes=0)
    fresh.set_epoch(1)
    assert second == list(fresh)

    heaviest = max(entry_weight(e) for e in (tables.fetch_table(str(v2), s) for s in ds.index.shards))
    tracked.fetched.clear()
    small = fastload.ShardDataset(v2, decode=False, cache_tables_bytes=2 * heaviest)
    assert list(small) == list(small) == read(v2, cache_tables_bytes=0)
    kept = small.table_memo()
    assert kept is not None and 2 <= len(kept) < len(names) and kept.weight <= 2 * heaviest
    # in index order those kept are the last read: each shard's table is fetched again in epoch 2
    assert len(tracked.fetched) == 3 * len(names)  # (the third: read() above, which keeps none)
    assert tracked.alive() == len(kept) + len(memo)  # (the first dataset keeps all of its own)


def test_a_flipped_data_byte_raises_naming_shard_key_and_offset(
    v2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ds"
    shutil.copytree(v2, root)
    name, key, offset, at = data_byte(root, 2, 4)
    flip(root / name, at)
    for kw, c in [
        ({"prefetch_bytes": 0}, True),
        ({"prefetch_bytes": 0}, False),
        ({"prefetch_bytes": 1 << 20}, True),
    ]:
        if not c:
            monkeypatch.setattr(native, "layout_run", None)
        with pytest.raises(VerifyError, match="CRC32C") as info:
            read(root, **kw)
        assert (info.value.shard, info.value.key, info.value.offset) == (name, key, offset)
        assert "fastload verify" in str(info.value)
    samples = {s["__key__"]: s for s in read(root, verify_samples=False)}
    assert len(samples) == fastload.ShardDataset(root).index.samples
    good = {s["__key__"]: s for s in read(v2)}
    assert [k for k in samples if samples[k] != good[k]] == [key]  # the damaged bytes, as they are


@pytest.mark.parametrize("how", ["missing", "damaged"])
def test_a_missing_or_damaged_sidecar_is_named(v2: Path, tmp_path: Path, how: str) -> None:
    root = tmp_path / "ds"
    shutil.copytree(v2, root)
    table = json.loads((root / "index.json").read_bytes())["shards"][3]["table"]["name"]
    if how == "missing":
        (root / table).unlink()
    else:
        flip(root / table, 10)
    with pytest.raises(FastloadError) as info:
        read(root)
    assert table in str(info.value) and "fastload index --upgrade" in str(info.value)
    if how == "missing":
        assert isinstance(info.value, NotFoundError)


# -- over S3 -------------------------------------------------------------------------------------------


@pytest.fixture
def served(v2: Path, tmp_path: Path) -> Iterator[tuple[S3Server, Path]]:
    """A copy of the v2 dataset served at s3://v2/ds (the copy can be damaged by the test)."""
    root = tmp_path / "bucket"
    shutil.copytree(v2, root / "ds")
    with S3Server(root, bucket=BUCKET) as server:
        yield server, root / "ds"


def s3kw(server: S3Server) -> dict[str, Any]:
    config = fastload.S3Config(endpoint_url=server.endpoint_url, addressing_style="path")
    return {"s3_config": config}


def gets(server: S3Server) -> int:
    return server.stats().requests.get("GET", 0)


@pytest.mark.usefixtures("s3_env")
def test_v2_over_s3_reads_like_local_and_the_cache_keeps_the_tables(
    served: tuple[S3Server, Path], v2: Path, tmp_path: Path
) -> None:
    server, _ = served
    url = f"s3://{BUCKET}/ds"
    local = read(v2, seed=5, shuffle_buffer=8)
    assert read(url, seed=5, shuffle_buffer=8, **s3kw(server)) == local
    _, dl = make_loader(url, batch_size=4, num_workers=2, seed=5, decode=False, **s3kw(server))
    _, dl_local = make_loader(str(v2), batch_size=4, num_workers=2, seed=5, decode=False)
    assert [list(b["__key__"]) for b in dl] == [list(b["__key__"]) for b in dl_local]
    ds = fastload.ShardDataset(url, decode=False, seed=5, cache_dir=tmp_path / "cache", **s3kw(server))
    assert list(ds) == read(v2, seed=5)
    before = gets(server)
    local_ds = fastload.ShardDataset(v2, decode=False, seed=5)
    local_ds.set_epoch(1)
    assert list(ds) == list(local_ds)  # a second epoch (the next one): shards and tables from the cache
    assert gets(server) == before


@pytest.mark.usefixtures("s3_env")
def test_a_flipped_byte_over_s3_raises_and_the_cache_heals(
    served: tuple[S3Server, Path], tmp_path: Path
) -> None:
    server, root = served
    url = f"s3://{BUCKET}/ds"
    name, key, offset, at = data_byte(root, 4, 2)
    expected = read(root)
    # a damaged cached copy (the remote is good): dropped, fetched again, read right
    cache = tmp_path / "cache"
    ds = fastload.ShardDataset(url, decode=False, cache_dir=cache, cache_verify=False, **s3kw(server))
    assert list(ds) == expected
    (cached,) = [p for p in cache.iterdir() if p.name.endswith(name)]
    flip(cached, at)
    assert list(ds) == expected
    assert ds.cache().refetched == 1  # type: ignore[union-attr]
    assert not [
        p for p in cache.iterdir() if p.name.endswith(name) and p.read_bytes() != (root / name).read_bytes()
    ]
    # the remote damaged: no cache, raises; with a cache, the fill refuses the shard
    flip(root / name, at)
    with pytest.raises(VerifyError) as info:
        read(url, **s3kw(server))
    assert (info.value.shard, info.value.key, info.value.offset) == (name, key, offset)
    with pytest.raises(VerifyError, match=name):
        read(url, cache_dir=tmp_path / "cache2", **s3kw(server))


@pytest.mark.usefixtures("s3_env")
@pytest.mark.filterwarnings("ignore:.*fails its CRC32C:UserWarning")
def test_a_damaged_remote_sample_is_skipped_with_or_without_a_cache(
    served: tuple[S3Server, Path], tmp_path: Path
) -> None:
    """on_error="skip" over S3: the damaged sample alone is left out. With cache_dir the cache refuses the
    shard (its file's CRC32C), so it is read uncached, sample by sample; a damaged cached copy of a good
    shard is still fetched again first (above)."""
    server, root = served
    url = f"s3://{BUCKET}/ds"
    expected = [s["__key__"] for s in read(root)]
    name, key, offset, at = data_byte(root, 4, 2)
    flip(root / name, at)
    want = [k for k in expected if k != key]
    for kw in ({}, {"cache_dir": tmp_path / "cache"}, {"cache_dir": tmp_path / "c2", "prefetch_bytes": 0}):
        ds = fastload.ShardDataset(url, decode=False, on_error="skip", **kw, **s3kw(server))
        assert [s["__key__"] for s in ds] == want, kw
        assert [(s.shard, s.key, s.offset) for s in ds.skipped_samples] == [(name, key, offset)]
        cached = {k: v for k, v in kw.items() if k == "cache_dir"}
        with fastload.MapDataset(url, decode=False, on_error="skip", **cached, **s3kw(server)) as m:
            assert [s["__key__"] for s in m[:]] == want and m.skipped == 1
    with pytest.raises(VerifyError, match=name):  # (without skip, the cache still refuses the shard)
        read(url, cache_dir=tmp_path / "c3", **s3kw(server))


def test_a_damaged_parquet_page_raises_naming_shard_row_group_and_keys(tmp_path: Path) -> None:
    packed = pack_files(tmp_path / "pq", small_files(), max_samples=7, shard_format="parquet")
    root = to_v2(packed, tmp_path / "ds")
    assert read(root) == read(packed.root)
    shard = packed.index["shards"][1]
    key = shard["keys"][3]
    path = root / shard["name"]
    at = path.read_bytes().find(packed.samples[key]["bin"])
    assert at > 0
    flip(path, at + 1)
    with pytest.raises(VerifyError, match="fails its checksum") as info:
        read(root)
    assert (info.value.shard, info.value.key) == (shard["name"], shard["keys"][0])
    assert f"row group 0 (keys {shard['keys'][0]!r}..{shard['keys'][-1]!r})" in str(info.value)


def test_a_shard_deleted_or_replaced_mid_epoch_is_named_never_mixed(tmp_path: Path) -> None:
    """A shard deleted while an epoch runs: NotFoundError naming it and what to do. One replaced by other
    bytes of the same size: the per-sample CRC32C refuses it (never samples mixed from two versions)."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"{i:03d}.txt").write_text(f"sample {i:03d}")
    fastload.pack(str(src), str(tmp_path / "ds"), progress=False, max_samples=10)
    shards = sorted(p.name for p in (tmp_path / "ds").glob("*.tar"))
    it = iter(fastload.ShardDataset(tmp_path / "ds", decode=False))
    next(it)
    (tmp_path / "ds" / shards[2]).unlink()
    with pytest.raises(NotFoundError, match=rf"shard {shards[2]}, listed in the dataset's index, is missing"):
        list(it)
    fastload.pack(str(src), str(tmp_path / "ds2"), progress=False, max_samples=10)
    if json.loads((tmp_path / "ds2" / "index.json").read_text())["version"] == 1:
        upgrade_index(tmp_path / "ds2")
    it = iter(fastload.ShardDataset(tmp_path / "ds2", decode=False))
    next(it)
    replaced = tmp_path / "ds2" / shards[2]
    data = bytearray(replaced.read_bytes())
    data[data.index(b"sample 02") + 8] ^= 0x01  # same size and keys, one byte of a value differs
    replaced.write_bytes(bytes(data))
    with pytest.raises(VerifyError, match=shards[2]):
        list(it)
