"""The local shard cache under a ShardDataset reading from S3 (moto on loopback): each shard is filled once
and later epochs read no byte from S3; a corrupted cached file is re-fetched, never used; the folder stays
within ``cache_limit_bytes`` by evicting the least recently used shards; a shard larger than the limit is
read from S3 directly; an S3 object that does not match the index raises VerifyError and caches nothing;
several processes filling the same shards fill each exactly once; a killed lock holder blocks no one."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

import fastload
from fastload.core.index import DatasetIndex, parse_index
from fastload.errors import VerifyError
from fastload.s3 import runtime
from fastload.storage import cache as shardcache
from fastload.storage.cache import ShardCache, file_crc32c

from .helpers import WORKER_TIMEOUT_S, Packed, make_loader

BUCKET = "fastload-cache-tests"
REGION = "us-east-1"
ACCESS_KEY, SECRET_KEY = "AKIDCACHETESTS", "cache-tests-secret"


def client_for(endpoint_url: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}),
    )


@pytest.fixture(scope="module")
def s3(moto_url: str) -> Iterator[Any]:
    client = client_for(moto_url)
    client.create_bucket(Bucket=BUCKET)
    yield client
    client.close()


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Dummy credentials in the environment (inherited by worker processes), nothing from this machine's
    AWS configuration, zeroed S3 counters; afterwards the S3 clients fastload cached here are closed."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    fastload.s3_stats(reset=True)
    yield
    runtime.reset()


@pytest.fixture
def config(moto_url: str) -> fastload.S3Config:
    return fastload.S3Config(endpoint_url=moto_url, addressing_style="path", part_size_bytes=64 << 10)


def upload(s3: Any, packed: Packed) -> str:
    """``packed``'s shards and its index as v1 (every sample listed, no sample tables: these tests count
    the shards the cache holds; a v2 index's tables, cached too, are tested in test_v2) under a fresh
    prefix; its ``s3://`` URL."""
    prefix = f"ds-{uuid.uuid4().hex[:12]}"
    for path in sorted(p for p in packed.root.rglob("*") if p.is_file()):
        rel = path.relative_to(packed.root).as_posix()
        if rel == "index.json":
            s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{rel}", Body=json.dumps(packed.index).encode())
        elif not rel.startswith(".") and not rel.endswith(".fltable"):
            s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{rel}", Body=path.read_bytes())
    return f"s3://{BUCKET}/{prefix}"


@pytest.fixture
def remote(s3: Any, uneven: Packed) -> str:
    return upload(s3, uneven)


def index_of(packed: Packed) -> DatasetIndex:
    return parse_index(json.dumps(packed.index).encode())  # (v1: what upload() puts there)


def shard_sizes(packed: Packed) -> dict[str, int]:
    return {s["name"]: s["bytes"] for s in packed.index["shards"]}


def cached_files(folder: Path) -> dict[str, int]:
    """Shard files in the cache folder (its own subfolders left out): name -> size."""
    return {e.name: e.stat().st_size for e in os.scandir(folder) if e.is_file(follow_symlinks=False)}


def tmp_files(folder: Path) -> list[str]:
    return os.listdir(folder / ".tmp")


def wait_for_prefetch_threads(timeout_s: float = 20.0) -> None:
    """After an error the consumer's prefetcher stops waiting for fetches still running (fills of other
    shards); let them end before looking at the folder."""
    deadline = time.monotonic() + timeout_s
    while any(t.name.startswith("fastload-prefetch") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "prefetch threads still running"
        time.sleep(0.01)


def holds(name: str, shard: str) -> bool:
    """Whether a cache file (``<digest>-<crc>-<shard>``) or a partial fill (the same ``.<pid>.<thread>``)
    is of ``shard``."""
    base = "-" + shard.replace("/", "_")
    return name.endswith(base) or base + "." in name


def shard_of(name: str, packed: Packed) -> str:
    """The shard a cache file holds."""
    matches = [s for s in shard_sizes(packed) if holds(name, s)]
    assert len(matches) == 1, (name, matches)
    return matches[0]


def check_samples(samples: list[dict[str, Any]], packed: Packed) -> None:
    """Every sample of ``packed`` exactly once, with the bytes it was packed from."""
    assert sorted(s["__key__"] for s in samples) == sorted(packed.keys)
    for s in samples:
        assert {k: v for k, v in s.items() if not k.startswith("__")} == packed.samples[s["__key__"]]


def check_cache_holds_exact_shards(folder: Path, packed: Packed) -> None:
    for name in cached_files(folder):
        shard = shard_of(name, packed)
        assert (folder / name).read_bytes() == (packed.root / shard).read_bytes(), shard


def dataset(url: str, cache: Path, config: fastload.S3Config, **kw: Any) -> fastload.ShardDataset:
    return fastload.ShardDataset(url, cache_dir=cache, s3_config=config, decode=False, **kw)


@pytest.mark.usefixtures("s3_env")
def test_first_epoch_fills_each_shard_once_and_later_epochs_read_nothing_from_s3(
    remote: str, uneven: Packed, tmp_path: Path, config: fastload.S3Config, s3: Any
) -> None:
    cache = tmp_path / "cache"
    ds = dataset(remote, cache, config)
    shards = len(uneven.counts)
    first = list(ds)
    check_samples(first, uneven)
    assert ds.cache().fills == shards and ds.cache().hits == 0
    assert len(cached_files(cache)) == shards and not tmp_files(cache)
    check_cache_holds_exact_shards(cache, uneven)
    assert fastload.s3_stats()["requests"] > 0

    fastload.s3_stats(reset=True)
    ds.set_epoch(1)
    second = list(ds)
    assert fastload.s3_stats()["requests"] == 0
    assert second == first
    assert ds.cache().fills == shards and ds.cache().hits == shards

    # the shards could even be gone from the bucket: a new dataset object (which checks each cached file's
    # CRC32C on first use) reads them all from the cache
    prefix = remote.removeprefix(f"s3://{BUCKET}/")
    for shard in shard_sizes(uneven):
        s3.delete_object(Bucket=BUCKET, Key=f"{prefix}/{shard}")
    again = dataset(remote, cache, config)
    fastload.s3_stats(reset=True)
    assert list(again) == first
    assert fastload.s3_stats()["requests"] == 0
    assert again.cache().fills == 0 and again.cache().hits == shards


@pytest.mark.usefixtures("s3_env")
@pytest.mark.parametrize("view", ["same-dataset", "new-dataset"])
def test_a_corrupted_cached_file_is_deleted_and_fetched_again(
    remote: str, uneven: Packed, tmp_path: Path, config: fastload.S3Config, view: str
) -> None:
    cache = tmp_path / "cache"
    ds = dataset(remote, cache, config)
    first = list(ds)
    victim = next(n for n in cached_files(cache) if shard_of(n, uneven) == uneven.index["shards"][2]["name"])
    good = (cache / victim).read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x40  # inside a sample's data: the tar still parses, only the checksum tells
    replacement = tmp_path / "replacement"
    replacement.write_bytes(bad)
    os.replace(replacement, cache / victim)  # same size, new inode, as a partial re-write would leave it
    assert (cache / victim).stat().st_size == len(good)

    if view == "new-dataset":
        ds = dataset(remote, cache, config)
    fills = ds.cache().fills
    fastload.s3_stats(reset=True)
    ds.set_epoch(1)
    second = list(ds)
    assert second == first
    check_samples(second, uneven)
    assert ds.cache().refetched == 1
    assert ds.cache().fills == fills + 1
    assert fastload.s3_stats()["bytes"] == len(good)  # that shard and nothing else came from S3
    assert (cache / victim).read_bytes() == good
    assert not tmp_files(cache)


class FolderWatch:
    """Samples the cache folder's bytes (shards and partial fills) on a thread while a test runs."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.peak = 0
        self.tmp_names: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cache-watch", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            total = 0
            for folder in (self.folder, self.folder / ".tmp"):
                try:
                    entries = list(os.scandir(folder))
                except FileNotFoundError:
                    continue
                for e in entries:
                    try:
                        if e.is_file(follow_symlinks=False):
                            total += e.stat(follow_symlinks=False).st_size
                            if folder.name == ".tmp":
                                self.tmp_names.add(e.name)
                    except FileNotFoundError:
                        pass
            self.peak = max(self.peak, total)

    def __enter__(self) -> FolderWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def lru_model(order: list[str], sizes: dict[str, int], limit: int) -> list[str]:
    """The shards an LRU cache of ``limit`` bytes holds after using ``order`` (each use: hit or fill)."""
    held: list[str] = []  # least recently used first
    for name in order:
        if sizes[name] > limit:
            continue
        if name in held:
            held.remove(name)
        held.append(name)
        while sum(sizes[n] for n in held) > limit:
            held.pop(0)
    return held


@pytest.mark.usefixtures("s3_env")
def test_a_limit_keeps_the_folder_small_and_evicts_least_recently_used(
    remote: str, uneven: Packed, tmp_path: Path, config: fastload.S3Config
) -> None:
    sizes = shard_sizes(uneven)
    limit = sorted(sizes.values())[-1] + sorted(sizes.values())[-2]  # any two shards fit, three do not
    assert limit < sum(sizes.values())
    cache = tmp_path / "cache"
    # one fetch thread: one fill at a time, so the folder holds at most the limit plus the shard being filled
    ds = dataset(remote, cache, config, cache_limit_bytes=limit, prefetch_threads=1)
    with FolderWatch(cache) as watch:
        samples = list(ds)
    check_samples(samples, uneven)
    assert ds.cache().fills == len(sizes)
    assert watch.peak <= limit + max(sizes.values()), (watch.peak, limit)
    held = cached_files(cache)
    assert sum(held.values()) <= limit
    order = list(dict.fromkeys(s["__shard__"] for s in samples))  # the order shards were first used in
    assert sorted(shard_of(n, uneven) for n in held) == sorted(lru_model(order, sizes, limit))
    check_cache_holds_exact_shards(cache, uneven)
    assert not tmp_files(cache)


@pytest.mark.usefixtures("s3_env")
def test_eviction_follows_use_not_fill_order(
    remote: str, uneven: Packed, tmp_path: Path, config: fastload.S3Config
) -> None:
    index = index_of(uneven)
    a, b, c = index.shards[2], index.shards[3], index.shards[4]
    limit = max(a.bytes + b.bytes, a.bytes + c.bytes, b.bytes + c.bytes)
    assert limit < a.bytes + b.bytes + c.bytes
    cache = ShardCache(tmp_path / "cache", limit_bytes=limit, config=config)
    other = ShardCache(tmp_path / "cache", limit_bytes=limit, config=config)  # another process's view

    def get(view: ShardCache, entry: Any) -> str:
        path = view.get(f"{remote}/{entry.name}", entry)
        time.sleep(0.03)  # file times are coarse (a clock tick): keep uses apart
        return path

    path_a = get(cache, a)
    path_b = get(cache, b)
    get(other, a)  # a use of a by another process makes b the least recently used
    path_c = get(cache, c)
    assert os.path.exists(path_a) and os.path.exists(path_c) and not os.path.exists(path_b)
    assert (cache.fills, other.hits) == (3, 1)
    get(cache, b)  # now a is the least recently used
    assert not os.path.exists(path_a) and os.path.exists(path_b) and os.path.exists(path_c)
    assert sum(cached_files(tmp_path / "cache").values()) <= limit


@pytest.mark.usefixtures("s3_env")
def test_a_shard_larger_than_the_limit_is_read_from_s3_without_caching(
    remote: str, uneven: Packed, tmp_path: Path, config: fastload.S3Config
) -> None:
    sizes = shard_sizes(uneven)
    big = max(sizes, key=sizes.__getitem__)
    limit = sizes[big] - 1
    assert sum(n <= limit for n in sizes.values()) == len(sizes) - 1
    cache = tmp_path / "cache"
    ds = dataset(remote, cache, config, cache_limit_bytes=limit)
    with FolderWatch(cache) as watch:
        samples = list(ds)
    check_samples(samples, uneven)
    assert ds.cache().fills == len(sizes) - 1
    names = set(cached_files(cache)) | watch.tmp_names
    assert names and not any(holds(n, big) for n in names)
    assert sum(cached_files(cache).values()) <= limit


@pytest.mark.usefixtures("s3_env")
def test_an_s3_object_that_does_not_match_the_index_raises_and_caches_nothing(
    s3: Any, uneven: Packed, tmp_path: Path, config: fastload.S3Config
) -> None:
    remote = upload(s3, uneven)
    shard = uneven.index["shards"][3]["name"]
    data = bytearray((uneven.root / shard).read_bytes())
    data[len(data) // 2] ^= 0x01  # same size, other bytes: re-written after packing
    s3.put_object(Bucket=BUCKET, Key=f"{remote.removeprefix(f's3://{BUCKET}/')}/{shard}", Body=bytes(data))
    cache = tmp_path / "cache"
    ds = dataset(remote, cache, config)
    with pytest.raises(VerifyError) as caught:
        list(ds)
    assert shard in str(caught.value) and "index.json" in str(caught.value)
    wait_for_prefetch_threads()
    assert not any(shard_of(n, uneven) == shard for n in cached_files(cache))
    assert not tmp_files(cache)
    check_cache_holds_exact_shards(cache, uneven)  # whatever else was cached is exact
    with pytest.raises(VerifyError):  # and it is not used next time either
        list(dataset(remote, cache, config))
    wait_for_prefetch_threads()


def _fill_all(folder: str, remote: str, index_json: bytes, config: Any, barrier: Any, out: Any) -> None:
    """A spawned process: wait for the others, then get every shard; report what it filled and read."""
    index = parse_index(index_json)
    cache = ShardCache(folder, config=config)
    barrier.wait(60)
    result = []
    for entry in index.shards:
        fills = cache.fills
        path = cache.get(f"{remote}/{entry.name}", entry)
        result.append((entry.name, cache.fills - fills, file_crc32c(path) == (entry.checksum, entry.bytes)))
    out.put((os.getpid(), result))


@pytest.mark.usefixtures("s3_env")
def test_processes_filling_the_same_shards_at_once_fill_each_once(
    remote: str, uneven: Packed, tmp_path: Path, config: fastload.S3Config
) -> None:
    cache = tmp_path / "cache"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_fill_all,
            args=(str(cache), remote, json.dumps(uneven.index).encode(), config, barrier, out),
        )
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=WORKER_TIMEOUT_S) for _ in procs]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * 4
    names = [s["name"] for s in uneven.index["shards"]]
    for name in names:
        per_process = [dict((n, f) for n, f, _ in r)[name] for _, r in results]
        assert sum(per_process) == 1, (name, per_process)
    assert all(ok for _, r in results for _, _, ok in r)
    assert sorted(shard_of(n, uneven) for n in cached_files(cache)) == sorted(names)
    check_cache_holds_exact_shards(cache, uneven)
    assert not tmp_files(cache)


LOCK_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(120)
"""


@pytest.mark.usefixtures("s3_env")
def test_a_killed_lock_holder_does_not_block_others(
    remote: str, uneven: Packed, tmp_path: Path, config: fastload.S3Config
) -> None:
    entry = index_of(uneven).shards[2]
    cache = ShardCache(tmp_path / "cache", config=config)
    url = f"{remote}/{entry.name}"
    lock_path = tmp_path / "cache" / ".locks" / (os.path.basename(cache.path_for(url, entry)) + ".lock")
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(lock_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with ThreadPoolExecutor(1) as pool:
            getting = pool.submit(cache.get, url, entry)
            time.sleep(0.5)
            assert not getting.done()  # waiting for the holder's fill
            assert fastload.s3_stats()["requests"] == 0
            holder.send_signal(signal.SIGKILL)
            holder.wait(10)
            path = getting.result(timeout=20)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()
    assert Path(path).read_bytes() == (uneven.root / entry.name).read_bytes()
    assert cache.fills == 1


@pytest.mark.usefixtures("s3_env")
def test_dataloader_workers_sharing_a_cache_deliver_every_sample_once(
    remote: str, uneven: Packed, tmp_path: Path, config: fastload.S3Config
) -> None:
    cache = tmp_path / "cache"
    _, dl = make_loader(
        remote,
        batch_size=3,
        num_workers=2,
        loader={"collate_fn": list},
        cache_dir=cache,
        s3_config=config,
        decode=False,
    )
    samples = [s for batch in dl for s in batch]
    assert len(samples) == len(uneven.keys)
    check_samples(samples, uneven)
    assert sorted(shard_of(n, uneven) for n in cached_files(cache)) == sorted(shard_sizes(uneven))
    check_cache_holds_exact_shards(cache, uneven)
    assert not tmp_files(cache)


@pytest.mark.usefixtures("s3_env")
def test_a_shard_evicted_right_after_it_is_opened_is_still_read(
    remote: str, uneven: Packed, tmp_path: Path, config: fastload.S3Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = shard_sizes(uneven)
    limit = max(sizes.values())  # one shard at a time
    cache = tmp_path / "cache"
    index = index_of(uneven)
    other = ShardCache(cache, limit_bytes=limit, config=config)  # another worker's view of the folder
    real_open = ShardCache.open
    evictions: list[str] = []

    def open_then_other_worker_evicts(self: ShardCache, url: str, entry: Any, **kw: Any) -> Any:
        f = real_open(self, url, entry, **kw)
        if self is not other:
            time.sleep(0.02)  # file times are coarse: the other worker's fill is newer
            names = [
                s.name for s in index.shards
            ]  # (the dataset's entries carry their format's payload read)
            neighbour = index.shards[(names.index(entry.name) + 1) % len(index.shards)]
            real_open(other, f"{remote}/{neighbour.name}", neighbour).close()  # its fill evicts ours
            if not os.path.exists(self.path_for(url, entry)):
                evictions.append(entry.name)
        return f

    monkeypatch.setattr(ShardCache, "open", open_then_other_worker_evicts)
    ds = dataset(remote, cache, config, cache_limit_bytes=limit, prefetch_bytes=0)
    check_samples(list(ds), uneven)
    assert evictions, "the other worker never evicted a shard that was being read: the race was not made"


@pytest.mark.usefixtures("s3_env")
def test_a_shard_evicted_while_its_checksum_is_checked_is_fetched_again(
    remote: str, uneven: Packed, tmp_path: Path, config: fastload.S3Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = index_of(uneven)
    mine, neighbour = index.shards[2], index.shards[3]
    folder = tmp_path / "cache"
    ShardCache(folder, config=config).get(f"{remote}/{mine.name}", mine)  # cached by an earlier epoch
    time.sleep(0.03)  # file times are coarse (a clock tick): the other worker's fill is newer
    limit = max(mine.bytes, neighbour.bytes)  # one shard at a time
    cache = ShardCache(folder, limit_bytes=limit, config=config)  # this worker: checks files on first use
    other = ShardCache(folder, limit_bytes=limit, config=config)  # another worker
    real_crc = shardcache._crc_of
    evicted: list[str] = []

    def crc_while_the_other_worker_evicts(f: Any) -> tuple[str, int]:
        if not evicted:
            evicted.append(f.name)
            other.get(f"{remote}/{neighbour.name}", neighbour)  # its fill evicts the file being checked
        return real_crc(f)

    monkeypatch.setattr(shardcache, "_crc_of", crc_while_the_other_worker_evicts)
    opened = cache.open(f"{remote}/{mine.name}", mine)
    assert evicted and opened is not None
    with opened:
        assert opened.read() == (uneven.root / mine.name).read_bytes()
