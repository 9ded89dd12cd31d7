"""Round trips: what `fastload pack` writes reads back byte-identical with WebDataset, GNU tar, pyarrow
and pandas."""

from __future__ import annotations

import filecmp
import os
import subprocess
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import fastload

from .helpers import expected_member_order, fields_of, pack_cli, read_index, shard_paths, webdataset_samples


@pytest.mark.parametrize("shard_size", ["256MiB", "16KiB"], ids=["one-shard", "many-shards"])
def test_tar_reads_back_with_webdataset_byte_identical(rich_tree, tmp_path, shard_size):
    dst = tmp_path / "dst"
    pack_cli(rich_tree.root, dst, "--shard-size", shard_size)
    shards = shard_paths(dst)
    if shard_size == "16KiB":
        assert len(shards) > 3, "the tree should span several shards at this size"

    got = webdataset_samples(shards)
    keys = [s["__key__"] for s in got]
    expected = rich_tree.samples()
    assert len(keys) == len(set(keys)), "a sample was yielded twice"
    assert set(keys) == set(expected)
    for sample in got:
        assert fields_of(sample) == expected[sample["__key__"]], sample["__key__"]


def test_gnu_tar_extracts_the_source_tree_byte_for_byte(rich_tree, tmp_path):
    dst = tmp_path / "dst"
    pack_cli(rich_tree.root, dst, "--shard-size", "16KiB")
    out = tmp_path / "extracted"
    out.mkdir()
    for shard in shard_paths(dst):
        subprocess.run(["tar", "-xf", shard, "-C", out], check=True, capture_output=True)

    extracted = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert extracted == sorted(rich_tree.files)
    match, mismatch, errors = filecmp.cmpfiles(rich_tree.root, out, list(rich_tree.files), shallow=False)
    assert (mismatch, errors) == ([], [])
    assert len(match) == len(rich_tree.files)


def test_gnu_tar_lists_members_of_each_sample_adjacent_and_sorted(rich_tree, tmp_path):
    dst = tmp_path / "dst"
    pack_cli(rich_tree.root, dst, "--shard-size", "16KiB")
    names: list[str] = []
    for shard in shard_paths(dst):
        listing = subprocess.run(
            ["tar", "--quoting-style=literal", "-tf", shard],
            check=True,
            capture_output=True,
            env={**os.environ, "LC_ALL": "C.UTF-8"},
        )
        names += listing.stdout.decode("utf-8").splitlines()
    assert names == expected_member_order(rich_tree.samples())


def test_tar_headers_are_normalised(rich_tree, tmp_path):
    """docs/pack.md: mode 0644, uid/gid 0, no user names, mtime 0; long and non-ASCII names use pax
    headers."""
    import tarfile

    dst = tmp_path / "dst"
    pack_cli(rich_tree.root, dst)
    (shard,) = shard_paths(dst)
    with tarfile.open(shard) as tf:
        infos = tf.getmembers()
    assert infos
    for info in infos:
        assert (info.mode, info.uid, info.gid, info.uname, info.gname, info.mtime) == (0o644, 0, 0, "", "", 0)
        assert info.isfile()
    long_or_unicode = [i for i in infos if len(i.name.encode()) > 100 or not i.name.isascii()]
    assert len(long_or_unicode) >= 5
    for info in long_or_unicode:
        assert info.pax_headers.get("path") == info.name


def _parquet_rows(dst: Path) -> list[dict]:
    rows: list[dict] = []
    for shard in shard_paths(dst):
        rows += pq.read_table(shard).to_pylist()
    return rows


def test_parquet_reads_back_with_pyarrow_and_pandas(sparse_tree, tmp_path):
    dst = tmp_path / "dst"
    pack_cli(sparse_tree.root, dst, "--format", "parquet", "--shard-size", "16KiB")
    expected = sparse_tree.samples()
    fields = sorted({f for fs in expected.values() for f in fs})
    shards = shard_paths(dst)
    assert len(shards) > 1

    for shard in shards:
        schema = pq.read_schema(shard)
        assert schema.names == ["__key__", *fields]
        assert schema.field("__key__").type == pa.string()
        for f in fields:
            assert schema.field(f).type == pa.binary()

    rows = _parquet_rows(dst)
    keys = [r["__key__"] for r in rows]
    assert keys == sorted(expected), "rows in sorted key order, none lost or duplicated"
    nulls = 0
    for row in rows:
        want = expected[row["__key__"]]
        for f in fields:
            assert row[f] == want.get(f), (row["__key__"], f)
            nulls += row[f] is None
    assert nulls > 10, "the sparse tree has many missing fields; they must come back as nulls"

    frames = pd.concat([pd.read_parquet(s) for s in shards], ignore_index=True)
    assert list(frames.columns) == ["__key__", *fields]
    assert frames["__key__"].tolist() == sorted(expected)
    for _, row in frames.iterrows():
        want = expected[row["__key__"]]
        for f in fields:
            value = row[f]
            if f in want:
                assert bytes(value) == want[f]
            else:
                assert value is None or pd.isna(value)


def test_parquet_hive_partitions_filter_by_split(split_tree, tmp_path):
    dst = tmp_path / "dst"
    pack_cli(
        split_tree.root, dst, "--format", "parquet", "--partition-by", "0:split", "--shard-size", "32KiB"
    )
    index = read_index(dst)
    assert {s["partition"] for s in index["shards"]} == {"split=train", "split=val"}
    for shard in index["shards"]:
        folder, _, name = shard["name"].rpartition("/")
        assert folder == shard["partition"] and name.endswith(".parquet")
        assert all(k.startswith(folder.split("=")[1] + "/") for k in shard["keys"]), "shard spans partitions"
    assert sorted(p.name for p in dst.iterdir()) == ["_fastload", "split=train", "split=val"]

    dataset = ds.dataset(dst, format="parquet", partitioning="hive", exclude_invalid_files=True)
    expected = split_tree.samples()
    table = dataset.to_table()
    assert sorted(table.column("__key__").to_pylist()) == sorted(expected)
    val = dataset.to_table(filter=ds.field("split") == "val").to_pylist()
    want_val = sorted(k for k in expected if k.startswith("val/"))
    assert sorted(r["__key__"] for r in val) == want_val and want_val
    for row in val:
        assert row["split"] == "val"
        assert {"jpg": row["jpg"], "cls": row["cls"]} == expected[row["__key__"]]


def test_parquet_row_group_size_changes_row_groups_and_index_matches_metadata(sparse_tree, tmp_path):
    big, small = tmp_path / "big", tmp_path / "small"
    pack_cli(sparse_tree.root, big, "--format", "parquet")
    pack_cli(sparse_tree.root, small, "--format", "parquet", "--row-group-size", "8KiB")
    groups = {}
    for dst in (big, small):
        index = read_index(dst)
        groups[dst.name] = 0
        for shard in index["shards"]:
            path = dst / shard["name"]
            meta = pq.read_metadata(path)
            assert meta.num_row_groups == len(shard["row_groups"])
            groups[dst.name] += meta.num_row_groups
            end = 4  # after the "PAR1" magic
            for i, (offset, size, rows) in enumerate(shard["row_groups"]):
                rg = meta.row_group(i)
                assert rows == rg.num_rows
                starts = []
                for c in range(rg.num_columns):
                    col = rg.column(c)
                    starts.append(col.data_page_offset)
                    if col.has_dictionary_page and col.dictionary_page_offset is not None:
                        starts.append(col.dictionary_page_offset)
                assert offset == min(starts) == end, "row groups tile the file from byte 4"
                assert size == sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
                end = offset + size
            assert end < path.stat().st_size
            assert sum(r for _, _, r in shard["row_groups"]) == shard["samples"]
    assert groups == {"big": 1, "small": groups["small"]}
    assert groups["small"] > 4
    # Each small row group holds at most 8 KiB of sample data unless it is a single sample.
    sizes = {k: sum(len(v) for v in fs.values()) for k, fs in sparse_tree.samples().items()}
    for shard in read_index(small)["shards"]:
        pos = 0
        for _, _, rows in shard["row_groups"]:
            keys = shard["keys"][pos : pos + rows]
            pos += rows
            assert rows == 1 or sum(sizes[k] for k in keys) <= 8 * 1024


def test_fsync_covers_shards_and_their_sample_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pack --fsync``: each shard and its sidecar table reach the disk before they are published."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"{i}.txt").write_text(str(i))
    synced: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    fastload.pack(str(src), str(tmp_path / "ds"), fsync=True, progress=False, max_samples=3)
    parts = [os.path.basename(p) for p in synced]
    assert sum(p.endswith(".table.part") for p in parts) == 2, parts
    assert sum(p.endswith(".part") and not p.endswith(".table.part") for p in parts) == 2, parts


def test_a_parquet_row_group_of_many_small_files_holds_few_descriptors(tmp_path: Path) -> None:
    """Each sample's files are closed before the next sample is opened: 1,500 samples of two files in one
    row group pack under a 256-descriptor limit (they once held every file of a row group open at once)."""
    import resource
    import sys

    src = tmp_path / "src"
    src.mkdir()
    for i in range(1500):
        (src / f"{i:05d}.txt").write_bytes(b"x" * (i % 7))
        (src / f"{i:05d}.cls").write_bytes(str(i % 10).encode())

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    dst = tmp_path / "dst"
    cmd = [sys.executable, "-m", "fastload", "pack", str(src), str(dst), "--format", "parquet", "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=low_limit, timeout=120)
    assert proc.returncode == 0, proc.stderr
    table = pq.read_table(next(dst.glob("*.parquet")))
    assert table.num_rows == 1500
    assert sorted(table.column("cls").to_pylist())[:3] == [b"0", b"0", b"0"]
    assert pq.ParquetFile(next(dst.glob("*.parquet"))).metadata.num_row_groups == 1


def test_running_out_of_file_descriptors_stops_the_pack_instead_of_skipping(tmp_path: Path) -> None:
    """EMFILE is this process's limit, not a bad input: opening a sample raises PackError saying how to fix
    it (a skip would leave the sample out, silently under --allow-skip); other failures stay skips."""
    import errno

    from fastload.core.keys import Sample
    from fastload.errors import PackError
    from fastload.storage.inputs import Input, open_sample
    from fastload.storage.listing import FileEntry

    class Failing:
        def __init__(self, code: int) -> None:
            self.code = code

        def open(self, entry: FileEntry):
            raise OSError(self.code, os.strerror(self.code), entry.path)

    entry = FileEntry("a.txt", str(tmp_path / "a.txt"), 1, "v")
    with pytest.raises(PackError, match="ulimit -n"):
        open_sample(Sample("a", (("txt", Input(Failing(errno.EMFILE), entry)),)))
    members, skip = open_sample(Sample("a", (("txt", Input(Failing(errno.EIO), entry)),)))
    assert members == [] and skip is not None and "Input/output error" in skip.reason
