"""The shard cache when its folder fails: a cache folder that cannot store a shard (a full disk: writes
failing with ENOSPC after a partial write, injected in real DataLoader workers, or a real small tmpfs where
this machine can mount one) never stops training: the shard is read from S3 past the cache, counted in
``epoch_report()["cache_bypassed"]`` and warned of once, naming the folder. A fill killed with SIGKILL leaves
its partial file in ``.tmp``; the next cache on the folder removes it (and never one a live fill holds)."""

# ruff: noqa: F811 (the fixtures of test_cache, imported, are parameters here)
from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import fastload
from fastload.storage import cache as shardcache
from fastload.storage.cache import ShardCache

from .helpers import Packed, make_loader
from .test_cache import (  # noqa: F401 (fixtures)
    cached_files,
    check_cache_holds_exact_shards,
    check_samples,
    config,
    dataset,
    index_of,
    remote,
    s3,
    s3_env,
    shard_sizes,
    tmp_files,
)


def failing_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every cache fill's write stores half its bytes, then fails as a full disk does (ENOSPC). Patched in
    this process before DataLoader workers fork, so it holds in them too."""

    def write_all(fd: int, data: memoryview) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(shardcache, "_write_all", write_all)


@pytest.mark.usefixtures("s3_env")
def test_a_cache_that_cannot_write_is_bypassed_with_one_warning_naming_the_folder(
    remote: str, uneven: Packed, tmp_path: Path, config: fastload.S3Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing_writes(monkeypatch)
    cache = tmp_path / "cache"
    ds = dataset(remote, cache, config)
    with pytest.warns(RuntimeWarning) as caught:
        samples = list(ds)
    check_samples(samples, uneven)
    messages = [str(w.message) for w in caught if "cache_dir=" in str(w.message)]
    assert len(messages) == 1, messages
    assert str(cache) in messages[0] and "No space left on device" in messages[0], messages[0]
    assert "read from s3://" in messages[0] and "another cache_dir" in messages[0], messages[0]
    shards = len(uneven.counts)
    assert ds.epoch_report()["cache_bypassed"] == shards
    assert ds.cache().bypassed == shards and ds.cache().fills == 0  # type: ignore[union-attr]
    assert cached_files(cache) == {} and tmp_files(cache) == []  # no partial fill left behind

    mix = fastload.Mix({"a": dataset(remote, cache, config)})  # a mixture reports its sources' count
    with pytest.warns(RuntimeWarning, match="cache_dir="):
        assert len(list(mix)) == len(uneven.keys)
    assert mix.epoch_report()["cache_bypassed"] == shards


@pytest.mark.usefixtures("s3_env")
@pytest.mark.filterwarnings("ignore:cache_dir=:RuntimeWarning")  # (given in the workers)
def test_dataloader_workers_whose_cache_fills_fail_train_on_every_sample(
    remote: str, uneven: Packed, tmp_path: Path, config: fastload.S3Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing_writes(monkeypatch)
    cache = tmp_path / "cache"
    ds, dl = make_loader(
        remote,
        batch_size=3,
        num_workers=2,
        loader={"collate_fn": list},
        cache_dir=cache,
        s3_config=config,
        decode=False,
    )
    samples = [s for batch in dl for s in batch]
    check_samples(samples, uneven)
    report = ds.epoch_report()
    # each worker opens the shards it reads (a shard read by both workers is bypassed by each)
    assert len(uneven.counts) <= report["cache_bypassed"] <= 2 * len(uneven.counts), report
    assert ds._shared.fields.cache_warned == 1
    assert cached_files(cache) == {} and tmp_files(cache) == []


@contextlib.contextmanager
def small_tmpfs(folder: Path, size_bytes: int) -> Iterator[Path]:
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(folder)], capture_output=True
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.decode(errors='replace').strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.mark.usefixtures("s3_env")
@pytest.mark.filterwarnings("ignore:cache_dir=:RuntimeWarning")  # (given in the workers)
def test_a_really_full_tmpfs_cache_keeps_training_going(
    remote: str, uneven: Packed, tmp_path: Path, config: fastload.S3Config
) -> None:
    """A 512 KiB tmpfs holds the first shards, then is full: the rest are read past it."""
    with small_tmpfs(tmp_path / "cache", 512 << 10) as cache:
        ds, dl = make_loader(
            remote,
            batch_size=3,
            num_workers=2,
            loader={"collate_fn": list},
            cache_dir=cache,
            s3_config=config,
            decode=False,
        )
        samples = [s for batch in dl for s in batch]
        check_samples(samples, uneven)
        report = ds.epoch_report()
        assert report["cache_bypassed"] >= 1, report
        assert ds._shared.fields.cache_warned == 1
        check_cache_holds_exact_shards(cache, uneven)  # what was stored is whole and right
        assert tmp_files(cache) == []
        assert 0 < len(cached_files(cache)) < len(uneven.counts)


FILLER = textwrap.dedent(
    """
    import os, sys, time
    from fastload.storage import cache as shardcache
    from fastload.core.index import parse_index

    folder, url, index_json, shard = sys.argv[1:5]
    entry = parse_index(open(index_json, "rb").read()).shards[int(shard)]

    def write_all(fd, data):  # store a little, say so, then hang: the parent kills us mid-fill
        os.write(fd, data[:1000])
        print("filling", flush=True)
        time.sleep(60)

    shardcache._write_all = write_all
    shardcache.ShardCache(folder).get(f"{url}/{entry.name}", entry)
    """
)


def write_index(tmp_path: Path, packed: Packed, config: fastload.S3Config, mp: pytest.MonkeyPatch) -> Path:
    """``packed``'s index in a file for a filler process, whose S3 settings come from the environment."""
    path = tmp_path / "index.json"
    path.write_text(json.dumps(packed.index))
    mp.setenv("AWS_ENDPOINT_URL", str(config.endpoint_url))
    mp.setenv("FASTLOAD_S3_ADDRESSING_STYLE", "path")
    return path


def start_filler(cache: Path, remote: str, index_json: Path, shard: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", FILLER, str(cache), remote, str(index_json), str(shard)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "filling"
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.mark.usefixtures("s3_env")
def test_a_fill_killed_midway_is_swept_by_the_next_cache_but_a_live_one_is_kept(
    remote: str, uneven: Packed, tmp_path: Path, config: fastload.S3Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    index_json = write_index(tmp_path, uneven, config, monkeypatch)
    live = start_filler(cache, remote, index_json, 2)
    try:
        killed = start_filler(cache, remote, index_json, 1)  # (its cache, made now, keeps the live fill's)
        stop(killed)
        partial = sorted(tmp_files(cache))
        assert len(partial) == 2, partial  # the killed fill's and the live one's
        fresh = ShardCache(cache, config=config)
        left = tmp_files(cache)
        assert len(left) == 1 and str(live.pid) in left[0], left  # only the live fill's stays
        assert fresh.sweep_partial_fills() == 0
    finally:
        stop(live)
    assert ShardCache(cache, config=config).sweep_partial_fills() == 0  # (swept when made)
    assert tmp_files(cache) == []


@pytest.mark.usefixtures("s3_env")
def test_eviction_counts_a_fill_under_way(
    remote: str, uneven: Packed, tmp_path: Path, config: fastload.S3Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fill in progress takes room that the limit must count: with a live partial fill of 1000 bytes in
    ``.tmp``, a limit that just fits two shards keeps one of them after the second fill."""
    sizes = shard_sizes(uneven)
    entries = index_of(uneven).shards
    cache = tmp_path / "cache"
    index_json = write_index(tmp_path, uneven, config, monkeypatch)
    live = start_filler(cache, remote, index_json, 3)
    try:
        limit = sizes[entries[0].name] + sizes[entries[1].name] + 500
        c = ShardCache(cache, config=config, limit_bytes=limit)
        c.get(f"{remote}/{entries[0].name}", entries[0])
        c.get(f"{remote}/{entries[1].name}", entries[1])
        assert len(cached_files(cache)) == 1, "the fill under way was counted, so one shard was evicted"
    finally:
        stop(live)


@pytest.mark.usefixtures("s3_env")
def test_cached_files_get_the_umask_s_mode(
    remote: str, uneven: Packed, tmp_path: Path, config: fastload.S3Config
) -> None:
    """As every file fastload makes for users (tests/integration/test_file_modes.py): a cache folder shared
    by a group (umask 002) is usable by the group."""
    entry = index_of(uneven).shards[0]
    old = os.umask(0o002)
    try:
        path = ShardCache(tmp_path / "cache", config=config).get(f"{remote}/{entry.name}", entry)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o664
    lock = tmp_path / "cache" / ".locks" / (os.path.basename(path) + ".lock")
    assert stat.S_IMODE(lock.stat().st_mode) == 0o664
