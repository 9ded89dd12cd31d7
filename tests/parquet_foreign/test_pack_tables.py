"""``fastload pack`` of tabular sources: a CSV manifest of image paths and labels, JSONL and Parquet tables,
a folder of them; file bytes packed in the rows, ``--sort-by`` (tight min/max per row group, recorded as
the sorting column), statistics on, missing files reported as skipped inputs, resume and its fingerprint."""

from __future__ import annotations

import csv
import itertools
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import fastload
from fastload.cli import main
from fastload.errors import ConfigError, PackError, SkippedInputError
from fastload.packing import table_shards

ROWS = 48


def write_manifest(root: Path, rows: int = ROWS, *, seed: int = 0) -> list[dict[str, Any]]:
    """Images under ``root/img`` and ``root/manifest.csv`` listing them (shuffled), with labels and dates."""
    (root / "img").mkdir(parents=True)
    out = []
    for i in range(rows):
        (root / "img" / f"{i:03d}.jpg").write_bytes(bytes([i]) * (50 + i))
        out.append(
            {"path": f"img/{i:03d}.jpg", "label": i % 5, "day": f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}"}
        )
    random.Random(seed).shuffle(out)
    with open(root / "manifest.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(out[0]))
        writer.writeheader()
        writer.writerows(out)
    return out


OPTIONS = {"shard_format": "parquet", "max_samples": 12, "row_group_bytes": 300, "progress": False}


def read_back(dst: Path) -> list[dict[str, Any]]:
    return list(fastload.ShardDataset(dst, decode=False))


def test_manifest_with_image_paths_sorted_by_day(tmp_path: Path) -> None:
    rows = write_manifest(tmp_path / "m")
    report = fastload.pack(
        tmp_path / "m" / "manifest.csv", tmp_path / "out", file_columns=["path=jpg"], sort_by="day", **OPTIONS
    )
    assert report.index.samples == ROWS and len(report.index.shards) > 1 and report.files == ROWS
    assert report.index.fields == ["day", "jpg", "label", "path"]
    assert report.index.options["sort_by"] == "day" and report.index.options["kind"] == "table"
    samples = read_back(tmp_path / "out")
    assert [str(s["day"]) for s in samples] == sorted(r["day"] for r in rows)
    for s in samples:
        assert s["jpg"] == (tmp_path / "m" / s["path"]).read_bytes() and type(s["label"]) is int
    # each row group's [min, max] of the sorted column lies after the previous one's: filters prune
    bounds = []
    for shard in report.index.shards:
        meta = pq.read_metadata(tmp_path / "out" / shard.name)
        assert meta.row_group(0).sorting_columns[
            0
        ].column_index == meta.schema.to_arrow_schema().get_field_index("day")
        for g in range(meta.num_row_groups):
            columns = {
                meta.row_group(g).column(c).path_in_schema: meta.row_group(g).column(c)
                for c in range(meta.num_columns)
            }
            for name in ("day", "label", "__key__"):
                assert columns[name].statistics is not None and columns[name].statistics.has_min_max, name
            assert columns["jpg"].statistics is None or not columns["jpg"].statistics.has_min_max
            bounds.append((columns["day"].statistics.min, columns["day"].statistics.max))
    assert len(bounds) > len(report.index.shards)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(bounds))
    assert fastload.verify(tmp_path / "out").ok


def test_missing_files_are_reported_like_other_skipped_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = write_manifest(tmp_path / "m", rows=6)
    gone = tmp_path / "m" / rows[2]["path"]
    gone.unlink()
    argv = ["pack", str(tmp_path / "m" / "manifest.csv"), str(tmp_path / "out"), "--format", "parquet"]
    argv += ["--file-column", "path", "--quiet"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"{gone}: missing (no such file)" in err and "nothing was written" in err
    assert not (tmp_path / "out" / "_fastload" / "index.json").exists()
    assert main([*argv, "--allow-skip"]) == 0
    index = json.loads((tmp_path / "out" / "_fastload" / "index.json").read_text())
    assert index["totals"]["samples"] == 5 and index["skipped"][0]["path"] == str(gone)
    got = {s["__key__"]: s for s in read_back(tmp_path / "out")}
    # the bytes replaced the paths (--file-column path): each row holds its image
    assert sorted(len(s["path"]) for s in got.values()) == sorted(
        50 + int(r["path"][4:7]) for r in rows if r is not rows[2]
    )


def test_jsonl_and_parquet_tables_in_a_folder_with_a_key_column(tmp_path: Path) -> None:
    src = tmp_path / "tables"
    src.mkdir()
    (src / "a.jsonl").write_text(
        "".join(json.dumps({"id": f"a{i}", "x": i, "v": [i, i + 1]}) + "\n" for i in range(5))
    )
    pq.write_table(
        pa.table({"id": [f"b{i}" for i in range(4)], "x": list(range(4)), "v": [[i, i] for i in range(4)]}),
        src / "b.parquet",
    )
    (src / "_SUCCESS").write_text("")
    report = fastload.pack(src, tmp_path / "out", rows=True, key_column="id", shuffle_seed=3, **OPTIONS)
    samples = read_back(tmp_path / "out")
    assert sorted(s["__key__"] for s in samples) == sorted(
        [f"a{i}" for i in range(5)] + [f"b{i}" for i in range(4)]
    )
    assert all(s["x"] == int(s["__key__"][1:]) and s["v"].tolist()[0] == s["x"] for s in samples)
    assert [s["__key__"] for s in samples] != sorted(
        s["__key__"] for s in samples
    ) and report.index.samples == 9
    with pytest.raises(ConfigError, match="key 'a1' names two rows"):
        (src / "c.jsonl").write_text(json.dumps({"id": "a1", "x": 9, "v": [9, 9]}) + "\n")
        fastload.pack(src, tmp_path / "out2", rows=True, key_column="id", **OPTIONS)
    with pytest.raises(ConfigError, match="--format parquet"):
        fastload.pack(src / "b.parquet", tmp_path / "out3", shard_format="tar", progress=False)


def test_interrupted_table_pack_resumes_to_the_same_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_manifest(tmp_path / "m")
    src = tmp_path / "m" / "manifest.csv"
    kw = {"file_columns": ["path=jpg"], "sort_by": "day", "workers": 1, **OPTIONS}
    clean = fastload.pack(src, tmp_path / "clean", **kw)
    assert len(clean.index.shards) >= 3
    real = table_shards.TableShard.write

    def fail_third(self: table_shards.TableShard, *args: Any, **kwargs: Any) -> Any:
        if self.number == 2:
            raise OSError("disk went away")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(table_shards.TableShard, "write", fail_third)
    with pytest.raises(OSError, match="disk went away"):
        fastload.pack(src, tmp_path / "out", **kw)
    monkeypatch.setattr(table_shards.TableShard, "write", real)
    with pytest.raises(PackError, match="changed"):
        fastload.pack(src, tmp_path / "out", resume=True, **{**kw, "sort_by": "label"})
    resumed = fastload.pack(src, tmp_path / "out", resume=True, **kw)
    assert resumed.shards_kept == 2 and resumed.shards_written == len(clean.index.shards) - 2
    manifest = Path("_fastload", "index.json")
    assert (tmp_path / "out" / manifest).read_bytes() == (tmp_path / "clean" / manifest).read_bytes()
    for shard in clean.index.shards:
        assert (tmp_path / "out" / shard.name).read_bytes() == (tmp_path / "clean" / shard.name).read_bytes()
    with open(src, "a") as f:
        f.write("img/000.jpg,9,2025-01-01\n")
    with pytest.raises(PackError, match="finished pack of other files or options"):
        fastload.pack(src, tmp_path / "out", resume=True, **kw)
    with pytest.raises(SkippedInputError):
        (tmp_path / "m" / "img" / "001.jpg").unlink()
        fastload.pack(src, tmp_path / "out4", **kw)
