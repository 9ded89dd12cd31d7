"""Parquet files written by other tools, read directly by ``ShardDataset`` (one warning, an index from the
footers) and indexed by ``fastload index`` (then no warning): keys, partitions, column values by type,
projection, verify, the errors for files that do not fit together, and DataLoader workers (exactly once)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pqf_helpers import Hive, hive_table

import fastload
from fastload.cli import main
from fastload.errors import ConfigError, VerifyError
from fastload.formats.parquet.foreign import RowKeys, partition_of
from fastload.formats.parquet.payload import footer_of
from fastload.packing.indexing import build_index


def opened(source: Any, **kw: Any) -> tuple[fastload.ShardDataset, list[str]]:
    """The dataset and the warnings made while opening it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = fastload.ShardDataset(source, decode=False, **kw)
    return ds, [str(w.message) for w in caught]


def read_all(source: Any, **kw: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Every sample (index order) and the warnings made while opening the dataset."""
    ds, caught = opened(source, **kw)
    return list(ds), caught


def footer_bytes(path: Path) -> bytes:
    """A Parquet file's footer (Thrift FileMetaData, without its length and magic)."""
    data = path.read_bytes()
    return data[-8 - int.from_bytes(data[-8:-4], "little") : -8]


def same_value(got: Any, want: Any) -> bool:
    if isinstance(got, np.ndarray):
        return got.tolist() == list(want)
    return type(got) is type(want) and got == want


def test_a_hive_folder_reads_directly_with_one_warning(hive: Hive) -> None:
    samples, caught = read_all(hive.root)
    assert len(caught) == 1 and "footers of 3 Parquet file(s)" in caught[0] and "fastload index" in caught[0]
    assert [s["__key__"] for s in samples] == list(hive.rows)  # _SUCCESS, .crc, _temporary/ left out
    for s in samples:
        want = hive.rows[s["__key__"]]
        assert set(s) == {*want, "__key__", "__index__", "__shard__"}
        for name, value in want.items():
            assert same_value(s[name], value), (name, s[name], value)
    first = samples[0]
    assert type(first["jpg"]) is bytes and type(first["id"]) is str and type(first["label"]) is int
    assert type(first["ok"]) is bool and type(first["score"]) is float and first["note"] == "n0"
    assert first["emb"].dtype == np.float32 and first["tags"].dtype == object
    assert samples[1]["note"] is None  # a null is None in a foreign file
    index = opened(hive.root)[0].index
    assert {s.name: s.partition for s in index.shards} == hive.partitions
    assert [s.row_groups[i][2] for s in index.shards for i in range(3)] == [2, 2, 1] * 3
    assert index.fields == sorted(hive_table(2024, 1).column_names)


def test_key_column_projection_and_shuffle(hive: Hive) -> None:
    samples, _ = read_all(hive.root, key_column="id", columns=["label"], seed=4, shuffle_buffer=5)
    assert sorted(s["__key__"] for s in samples) == sorted(r["id"] for r in hive.rows.values())
    assert all(set(s) == {"__key__", "__index__", "__shard__", "label"} for s in samples)
    by_id = {r["id"]: r for r in hive.rows.values()}
    assert all(s["label"] == by_id[s["__key__"]]["label"] for s in samples)
    with pytest.raises(ConfigError, match="no column 'nope'"):
        opened(hive.root, key_column="nope")


def test_map_dataset_takes_a_key_column(hive: Hive) -> None:
    """As ShardDataset does (it was a raw TypeError): samples named by the column, in index order."""
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        ds = fastload.MapDataset(hive.root, decode=False, key_column="id")
        with pytest.raises(ConfigError, match="no column 'nope'"):
            fastload.MapDataset(hive.root, key_column="nope")
    by_index, _ = read_all(hive.root, key_column="id")
    assert [ds[i]["__key__"] for i in range(len(ds))] == [s["__key__"] for s in by_index]


def test_fastload_index_then_no_warning_verify_and_inspect(
    hive: Hive, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "events"
    shutil.copytree(hive.root, root)
    assert main(["index", str(root), "--key-column", "id"]) == 0
    assert "indexed 15 samples in 3 Parquet file(s)" in capsys.readouterr().out
    index = json.loads((root / "_fastload" / "index.json").read_text())  # where pandas does not look
    assert index["version"] == 2 and index["options"]["key_column"] == "id"
    assert [s["partition"] for s in index["shards"]] == list(hive.partitions.values())
    assert all(s["table"]["name"] == f"_fastload/{s['name']}.fltable" for s in index["shards"])
    assert all((root / s["table"]["name"]).is_file() for s in index["shards"])
    tables = fastload.formats.load_index(str(root), tables=True)  # the footers read to index, kept
    assert all(footer_of(s) and footer_of(s) == footer_bytes(root / s.name) for s in tables.shards)
    samples, caught = read_all(root)
    assert caught == [] and [s["__key__"] for s in samples] == [r["id"] for r in hive.rows.values()]
    assert fastload.verify(root).ok
    with pytest.raises(ConfigError, match="key_column='label'"):
        fastload.ShardDataset(root, key_column="label")
    (root / "_fastload" / "index.json").unlink()
    linted = fastload.verify(root)
    assert linted.ok and not linted.indexed and linted.samples == 15, linted.summary()


def test_files_with_different_columns_are_refused(tmp_path: Path) -> None:
    pq.write_table(hive_table(2024, 1), tmp_path / "a.parquet")
    other = hive_table(2024, 2).set_column(1, "label", pa.array(["x"] * 5)).drop_columns(["ok"])
    pq.write_table(other, tmp_path / "b.parquet")
    with pytest.raises(ConfigError) as caught:
        opened(tmp_path)
    message = str(caught.value)
    assert "a.parquet and " in message and "b.parquet have different columns" in message
    assert "label: int32 vs string" in message and "ok: bool vs (absent)" in message
    report_error = pytest.raises(ConfigError, match="different columns")
    with report_error:
        build_index(tmp_path)
    assert not (tmp_path / "index.json").exists() and not (tmp_path / "_fastload").exists()


def test_bad_keys_and_bad_files_are_named(tmp_path: Path) -> None:
    table = pa.table({"id": ["a", "b", "a"], "k": ["x", None, "z"]})
    pq.write_table(table, tmp_path / "dup.parquet")
    with pytest.raises(ConfigError, match=r"key 'a' names two samples \(dup.parquet and dup.parquet\)"):
        opened(tmp_path, key_column="id")
    with pytest.raises(VerifyError, match=r"dup\.parquet: row 1 has no 'k'"):
        opened(tmp_path, key_column="k")
    (tmp_path / "torn.parquet").write_bytes(b"PAR1" + b"x" * 40)
    report = build_index(tmp_path)
    assert (
        not report.ok
        and "torn.parquet" in str(report.problems[0])
        and "no PAR1 at its end" in str(report.problems[0])
    )


def test_pandas_written_files(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(
        {
            "path": [f"img/{i}.jpg" for i in range(6)],
            "cls": pd.Categorical(["cat", "dog", "cat", "cow", "dog", "cat"]),
            "w": [0.5, 1.5, None, 2.0, 3.0, 4.0],
            "when": pd.date_range("2024-01-01", periods=6, freq="D", tz="UTC"),
        }
    )
    frame.iloc[:3].to_parquet(tmp_path / "a.parquet")
    frame.iloc[3:].reset_index(drop=True).to_parquet(tmp_path / "b.parquet")
    samples, caught = read_all(tmp_path, key_column="path")
    assert len(caught) == 1 and [s["__key__"] for s in samples] == list(frame["path"])
    assert [s["cls"] for s in samples] == list(frame["cls"])
    assert samples[2]["w"] is None and samples[3]["w"] == 2.0
    assert [s["when"] for s in samples] == [t.to_pydatetime() for t in frame["when"]]


def test_duckdb_copy_with_partition_by(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    out = tmp_path / "duck"
    con = duckdb.connect()
    con.execute(
        "COPY (SELECT i AS id, i % 2 AS part, 'row ' || i AS txt, [i, i + 1] AS pair, i * 0.5 AS half "
        f"FROM range(7) t(i)) TO '{out}' (FORMAT PARQUET, PARTITION_BY (part))"
    )
    con.close()
    samples, caught = read_all(out, key_column="id")
    assert len(caught) == 1
    assert sorted(int(s["__key__"]) for s in samples) == list(range(7))
    for s in samples:
        i = s["id"]
        assert s["txt"] == f"row {i}" and s["pair"].tolist() == [i, i + 1] and s["half"] == i * 0.5
        assert s["__shard__"].startswith(f"part={i % 2}/")
    assert {e.partition for e in opened(out, key_column="id")[0].index.shards} == {"part=0", "part=1"}


def test_hugging_face_style_export_with_an_image_struct(tmp_path: Path) -> None:
    """``datasets`` ``to_parquet``/``push_to_hub`` layout: ``data/<split>-0000i-of-0000n.parquet``, an
    ``Image`` feature stored as a struct of bytes and path, a ClassLabel as int64, its own schema metadata."""
    for i in range(2):
        image = pa.array([{"bytes": bytes([i, j]) * 3, "path": f"{i}-{j}.png"} for j in range(3)])
        table = pa.table({"image": image, "label": pa.array([j % 2 for j in range(3)], pa.int64())})
        table = table.replace_schema_metadata({b"huggingface": b'{"info": {"features": {}}}'})
        (tmp_path / "data").mkdir(exist_ok=True)
        pq.write_table(table, tmp_path / "data" / f"train-0000{i}-of-00002.parquet")
    samples, caught = read_all(tmp_path)
    assert len(caught) == 1 and [s["__key__"] for s in samples][:2] == [
        "data/train-00000-of-00002/000000",
        "data/train-00000-of-00002/000001",
    ]
    assert samples[4]["image"] == {"bytes": bytes([1, 1]) * 3, "path": "1-1.png"} and samples[4]["label"] == 1


@pytest.mark.filterwarnings("ignore:.*no index.json:UserWarning")
def test_dataloader_workers_read_each_row_exactly_once(hive: Hive) -> None:
    ds = fastload.ShardDataset(hive.root, decode=False, seed=1)
    loader = fastload.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=list, timeout=60)
    keys = [s["__key__"] for batch in loader for s in batch]
    assert sorted(keys) == sorted(hive.rows) and len(keys) == len(set(keys))
    ranks = [fastload.ShardDataset(hive.root, decode=False, rank=r, world_size=2) for r in (0, 1)]
    both = [s["__key__"] for ds in ranks for s in ds]
    assert len(both) == 14 and len(set(both)) == 14


def test_keys_and_partitions_are_pure() -> None:
    keys = RowKeys("a/b", 3)
    assert list(keys) == ["a/b/000000", "a/b/000001", "a/b/000002"] == keys[:] and keys[-1] == "a/b/000002"
    with pytest.raises(IndexError):
        keys[3]
    assert partition_of("year=2024/month=01/x.parquet") == "year=2024/month=01"
    assert partition_of("raw/year=2024/x.parquet") == "year=2024" and partition_of("x.parquet") is None


def test_names_are_relative_to_the_folder_given(tmp_path: Path) -> None:
    """One partition only: its folders still name the partition (names are relative to the dataset's
    folder, as `fastload index` writes them, not to the files' common folder)."""
    (tmp_path / "ds" / "year=2024" / "month=03").mkdir(parents=True)
    pq.write_table(hive_table(2024, 3), tmp_path / "ds" / "year=2024" / "month=03" / "p.parquet")
    ds, _ = opened(tmp_path / "ds")
    assert [(s.name, s.partition) for s in ds.index.shards] == [
        ("year=2024/month=03/p.parquet", "year=2024/month=03")
    ]


def test_a_folder_named_like_a_parquet_file(hive: Hive, tmp_path: Path) -> None:
    """Spark writes ``df.write.parquet("events.parquet")`` as a folder of part files."""
    shutil.copytree(hive.root, tmp_path / "events.parquet")
    ds, caught = opened(tmp_path / "events.parquet")
    assert len(caught) == 1 and [s.partition for s in ds.index.shards] == list(hive.partitions.values())


@pytest.mark.filterwarnings("ignore:.*no index.json:UserWarning")
def test_footers_read_to_index_are_read_with_and_never_taken_for_another_files(tmp_path: Path) -> None:
    """The footers an in-memory index reads are in its entries, so reading a file (planning a filter on its
    row-group statistics, then its rows) reads no tail again; and two datasets' files of the same name and
    size (checksum unknown: ``""``) do not share a cached footer, whose statistics would be the other's."""
    from fastload.formats.parquet.format import PARQUET

    for name, base in (("a", 0), ("b", 1000)):
        (tmp_path / name).mkdir()
        table = pa.table({"x": pa.array(range(base, base + 10), pa.int64())})
        pq.write_table(table, tmp_path / name / "part-0.parquet", row_group_size=5, compression="none")
    a, b = (tmp_path / n / "part-0.parquet" for n in "ab")
    assert a.stat().st_size == b.stat().st_size
    for name, want in (("a", []), ("b", list(range(1005, 1010)))):
        ds = fastload.ShardDataset(tmp_path / name, filters=[("x", ">=", 1005)], decode=False)
        assert ds.index.shards[0].checksum == "" and footer_of(ds.index.shards[0]) == footer_bytes(
            a.parent.parent / name / "part-0.parquet"
        )
        assert [s["x"] for s in ds] == want
    entry = fastload.ShardDataset(b.parent, decode=False).index.shards[0]
    data = b.read_bytes()
    reads: list[tuple[int, int]] = []

    def read(offset: int, size: int) -> bytes:
        reads.append((offset, size))
        return data[offset : offset + size]

    source = PARQUET.samples(entry, read=read, file=None, fd=None)  # type: ignore[arg-type]
    assert [r["x"] for r in source.load([7, 2], ["x"])()] == [1007, 1002]
    assert reads and all(o + n <= len(data) - len(footer_of(entry)) - 8 for o, n in reads)  # (no tail)


def test_an_in_memory_index_keeps_footers_up_to_a_cap(hive: Hive, monkeypatch: pytest.MonkeyPatch) -> None:
    """Footers beyond ``KEPT_FOOTER_BYTES`` are dropped from the in-memory index (the first files keep
    theirs); files without one are read (and filtered) from their tails, with the same samples."""
    from fastload.train import source

    full, _ = opened(hive.root)
    sizes = [len(footer_of(s)) for s in full.index.shards]
    monkeypatch.setattr(source, "KEPT_FOOTER_BYTES", sizes[0])
    capped, _ = opened(hive.root)
    assert [len(footer_of(s)) for s in capped.index.shards] == [sizes[0], 0, 0]
    got, want_samples = list(capped), list(full)
    assert [s["__key__"] for s in got] == [s["__key__"] for s in want_samples] == list(hive.rows)
    for a, b in zip(got, want_samples, strict=True):
        assert a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    flt = [("label", ">=", 1)]
    want = [s["__key__"] for s in opened(hive.root, filters=flt)[0]]
    monkeypatch.setattr(source, "KEPT_FOOTER_BYTES", 0)
    capped, _ = opened(hive.root, filters=flt)
    assert [s["__key__"] for s in capped] == want and want
