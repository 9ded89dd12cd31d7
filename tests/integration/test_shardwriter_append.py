"""``fastload.ShardWriter(dst, mode="append")`` into a local dataset: new shards after the existing ones as a
new version, existing files untouched, the pre-append stream still readable as its version, refusals that
name what differs, nothing left by a failed append, and writers appending at once that all land."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

import fastload
from fastload.errors import ConfigError, PackError, SampleError

from .helpers import read_manifest, run_cli, snapshot


def sample(i: int, tag: str = "") -> dict[str, Any]:
    return {"__key__": f"k{i:05d}", "txt": f"text {tag}{i} " * (i % 5 + 1), "json": {"i": i}}


def write(dst: Path, numbers: range, *, mode: str = "create", **options: Any) -> fastload.WriteReport:
    with fastload.ShardWriter(dst, mode=mode, max_samples_per_shard=2, workers=1, **options) as w:
        for i in numbers:
            w.write(sample(i))
    return w.report


def stream(dst: Path, **kwargs: Any) -> list[tuple[str, bytes, bytes]]:
    """Every sample as read, in order (no shuffle): key and bytes."""
    ds = fastload.ShardDataset(dst, decode=False, **kwargs)
    return [(s["__key__"], s["txt"], s["json"]) for s in ds]


def test_an_append_is_a_new_version_after_the_existing_shards(tmp_path: Path) -> None:
    dst = tmp_path / "ds"
    write(dst, range(5))
    before, first = snapshot(dst), read_manifest(dst)
    inodes = {p.name: p.stat().st_ino for p in dst.iterdir() if p.name != "index.json"}
    old_stream = stream(dst)
    old_shuffled = stream(dst, seed=3, shuffle_buffer=4)

    report = write(dst, range(5, 10), mode="append")

    assert report.samples == 5 and report.shards == 3  # what this writer wrote
    assert report.appended is not None and report.appended[0].version == 2
    assert "appended as version 2" in report.summary() and "10 samples in 6 shard(s)" in report.summary()
    after = snapshot(dst)
    for name, data in before.items():
        if name != "index.json":
            assert after[name] == data, f"{name} was rewritten by the append"
    assert {p.name: p.stat().st_ino for p in dst.iterdir() if p.name in inodes} == inodes
    index = read_manifest(dst)
    names = [s["name"] for s in index["shards"]]
    assert names[:3] == [s["name"] for s in first["shards"]] == [f"shard-{n:06d}.tar" for n in range(3)]
    tag = names[3].rsplit("-", 1)[1].split(".")[0]
    assert names[3:] == [f"shard-{n:06d}-{tag}.tar" for n in range(3, 6)]
    v1, v2 = index["versions"]
    assert (v1["version"], v1["shards"], v1["samples"], v1["added"]) == (1, 3, 5, 3)
    assert (v2["version"], v2["shards"], v2["samples"], v2["added"]) == (2, 6, 10, 3)
    assert v2["created"].endswith("Z") and len(v2["fingerprint"]) == 32
    assert index["totals"] == {**index["totals"], "shards": 6, "samples": 10}
    assert not (dst / ".fastload-pack").exists()  # journal and locks removed

    assert stream(dst, version=1) == old_stream  # the pre-append stream, exactly
    assert stream(dst, version=1, seed=3, shuffle_buffer=4) == old_shuffled  # (shuffled the same way too)
    assert [k for k, *_ in stream(dst)] == [f"k{i:05d}" for i in range(10)]
    run_cli("verify", dst, check=True)

    write(dst, range(10, 11), mode="append")  # a second append from Python: its own tag, version 3
    assert [v["added"] for v in read_manifest(dst)["versions"]] == [3, 3, 1]
    assert stream(dst, version=2) == stream(dst)[:10]


def test_a_dataset_opened_before_an_append_keeps_reading_its_version(tmp_path: Path) -> None:
    dst = tmp_path / "ds"
    write(dst, range(6))
    ds = fastload.ShardDataset(dst, decode=False, seed=0)
    expected = sorted(s["__key__"] for s in ds)
    write(dst, range(6, 9), mode="append")
    assert sorted(s["__key__"] for s in ds) == expected  # the index it opened: version 1
    loader = fastload.DataLoader(ds, batch_size=2, num_workers=2, collate_fn=list)
    assert sorted(s["__key__"] for batch in loader for s in batch) == expected  # (workers too)
    ds.set_epoch(1)
    assert sorted(s["__key__"] for s in ds) == expected  # (and its next epochs)
    assert len(fastload.MapDataset(dst, version=1, decode=False)) == 6
    assert len([s["__key__"] for s in fastload.ShardDataset(dst, decode=False)]) == 9


def test_create_refuses_a_dataset_naming_append_and_append_starts_one_in_an_empty_folder(
    tmp_path: Path,
) -> None:
    dst = tmp_path / "ds"
    write(dst, range(2))
    with pytest.raises(PackError, match=r"holds a dataset \(index.json\); pass mode='append'"):
        fastload.ShardWriter(dst)
    fresh = tmp_path / "fresh"
    report = write(fresh, range(3), mode="append")  # nothing there yet: version 1 of a new dataset
    assert report.appended is not None and report.appended[0].version == 1
    assert [v["version"] for v in read_manifest(fresh)["versions"]] == [1]
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    with pytest.raises(PackError, match=r"no index\.json"):
        fastload.ShardWriter(other, mode="append")
    assert sorted(os.listdir(other)) == ["notes.txt"]


def test_another_format_option_mode_or_parts_is_refused_naming_it(tmp_path: Path) -> None:
    dst = tmp_path / "ds"
    write(dst, range(2))
    before = snapshot(dst)
    with pytest.raises(ConfigError, match=r"shard_format: the dataset is tar.*format='tar'"):
        fastload.ShardWriter(dst, mode="append", format="parquet")
    pq = tmp_path / "pq"
    write(pq, range(2), format="parquet")
    with pytest.raises(ConfigError, match=r"compression: 'none' in the dataset, 'zstd' in this append"):
        fastload.ShardWriter(pq, mode="append", format="parquet", compression="zstd")
    with pytest.raises(ConfigError, match=r"mode='add'; choose 'create'.*or 'append'"):
        fastload.ShardWriter(dst, mode="add")
    with pytest.raises(ConfigError, match=r"mode='append' with part=/parts= is not supported"):
        fastload.ShardWriter(dst, mode="append", part=0, parts=2)
    assert snapshot(dst) == before


def test_a_key_the_dataset_holds_is_refused(tmp_path: Path) -> None:
    dst = tmp_path / "ds"
    write(dst, range(4))
    before = snapshot(dst)
    with fastload.ShardWriter(dst, mode="append") as w:
        with pytest.raises(SampleError, match=r"'k00002' was written already.*dataset appended to"):
            w.write(sample(2))
        w.write(sample(7))  # the writer stays usable
    assert [k for k, *_ in stream(dst)] == [*(f"k{i:05d}" for i in range(4)), "k00007"]
    with fastload.ShardWriter(dst, mode="append", keys="ordered") as w:  # (the last shard's keys only)
        with pytest.raises(SampleError, match=r"does not come after 'k00007'"):
            w.write(sample(5))
        w.write(sample(8))
    with fastload.ShardWriter(dst, mode="append", keys="off") as w:
        w.write(sample(0))  # trusted
    after = snapshot(dst)
    assert len(stream(dst)) == 7 and all(after[n] == d for n, d in before.items() if n != "index.json")


def test_an_exception_or_abort_in_an_append_leaves_the_dataset_as_it_was(tmp_path: Path) -> None:
    dst = tmp_path / "ds"
    write(dst, range(3))
    before = snapshot(dst)
    with (
        pytest.raises(RuntimeError, match="stop") as caught,
        fastload.ShardWriter(dst, mode="append", max_samples_per_shard=1) as w,
    ):
        for i in range(3, 7):  # (shards are published before the exception)
            w.write(sample(i))
        raise RuntimeError("stop")
    assert "was not published" in "".join(getattr(caught.value, "__notes__", []))
    assert snapshot(dst) == before and sorted(os.listdir(dst)) == sorted(before)
    w = fastload.ShardWriter(dst, mode="append", max_samples_per_shard=1)
    for i in range(3, 6):
        w.write(sample(i))
    w.abort()
    assert snapshot(dst) == before and sorted(os.listdir(dst)) == sorted(before)


def test_writers_appending_at_once_all_land(tmp_path: Path) -> None:
    dst = tmp_path / "ds"
    write(dst, range(2))
    errors: list[BaseException] = []

    def append(j: int) -> None:
        try:
            write(dst, range(100 * (j + 1), 100 * (j + 1) + 7), mode="append")
        except BaseException as exc:  # (raised in the test's thread below)
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(j,)) for j in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    index = read_manifest(dst)
    assert [v["version"] for v in index["versions"]] == [1, 2, 3, 4]
    assert sorted(v["added"] for v in index["versions"][1:]) == [4, 4, 4]
    keys = sorted(k for k, *_ in stream(dst))
    assert keys == sorted(
        ["k00000", "k00001", *(f"k{100 * (j + 1) + i:05d}" for j in range(3) for i in range(7))]
    )
    run_cli("verify", dst, check=True)


def test_an_append_to_parquet_writes_the_dataset_s_columns(tmp_path: Path) -> None:
    """Other tools read a Parquet dataset's folder as one table: appended shards have its columns."""
    dst = tmp_path / "pq"
    with fastload.ShardWriter(dst, format="parquet", max_samples_per_shard=2) as w:
        for i in range(4):
            w.write({"__key__": f"k{i:05d}", "txt": f"t{i}", "cls": i})
    with fastload.ShardWriter(dst, format="parquet", mode="append", max_samples_per_shard=2) as w:
        with pytest.raises(SampleError, match=r"field 'json'.*columns \(cls, txt\)"):
            w.write({"__key__": "k00009", "json": {"a": 1}})
        w.write({"__key__": "k00004", "txt": "t4", "cls": 4})
    with pytest.raises(ConfigError, match=r"fields=\['txt'\] differ from the dataset's columns"):
        fastload.ShardWriter(dst, format="parquet", mode="append", fields=["txt"])
    import pyarrow.dataset as pads

    table = pads.dataset(dst, format="parquet", exclude_invalid_files=True).to_table()
    assert table.num_rows == 5 and {"__key__", "txt", "cls"} <= set(table.column_names)
