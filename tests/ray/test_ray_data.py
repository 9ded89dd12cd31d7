"""``fastload.to_ray`` and ``fastload.from_ray`` on a local 2-CPU Ray cluster: a packed dataset (tar, Parquet,
TFRecord) read as a ``ray.data`` Dataset gives every sample's bytes, and a ``ray.data`` pipeline writes shards
that verify and read back the same."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from ray_helpers import uneven_files, write_files

import fastload
from fastload.errors import ConfigError, PackError
from fastload.packing.upgrade import upgrade_index

pytestmark = [
    pytest.mark.usefixtures("ray_cluster"),
    # Ray Data's own DataContext() assigns its deprecated fields in __init__ and warns about each (Ray 2.60);
    # nothing here sets them, so deprecation warnings raised in ray.data.context (only there) are ignored.
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context"),
]


@pytest.fixture(scope="module", autouse=True)
def quiet_ray_data(ray_cluster: Any) -> None:
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False


def expected_samples(files: dict[str, bytes]) -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    for rel, data in files.items():
        folder, _, base = rel.rpartition("/")
        stem, _, field = base.partition(".")
        out.setdefault(f"{folder}/{stem}", {})[field] = data
    return out


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    return uneven_files()


@pytest.fixture(scope="module")
def packed(files: dict[str, bytes], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("ray-data")
    src = write_files(base / "src", files)
    out = {}
    for fmt in ("tar", "parquet", "tfrecord"):
        fastload.pack(src, base / fmt, progress=False, shard_format=fmt, shard_size_bytes=64 << 10)
        out[fmt] = base / fmt
    shutil.copytree(base / "tar", base / "tar-v2")
    if json.loads((base / "tar-v2" / "index.json").read_bytes())["version"] == 1:
        upgrade_index(str(base / "tar-v2"))  # (index v2: each task fetches its shard's sample table)
    out["tar-v2"] = base / "tar-v2"
    return out


def by_key(rows: list[dict[str, Any]]) -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    for row in rows:
        assert row["__key__"] not in out, f"{row['__key__']} read twice"
        out[row["__key__"]] = {k: v for k, v in row.items() if k != "__key__" and v is not None}
    return out


@pytest.mark.parametrize("fmt", ["tar", "parquet", "tfrecord", "tar-v2"])
def test_to_ray_reads_every_sample(fmt: str, packed: dict[str, Path], files: dict[str, bytes]) -> None:
    ds = fastload.to_ray(packed[fmt])
    rows = ds.take_all()
    assert set(ds.schema().names) == {"__key__", "cls", "jpg", "seg.png", "bin", "txt"}
    assert by_key(rows) == expected_samples(files)  # missing fields are null, never dropped or invented
    if fmt.startswith("tar"):  # the index file itself names the dataset too
        assert fastload.to_ray(packed[fmt] / "index.json").count() == len(rows)


@pytest.mark.parametrize("fmt", ["tar", "parquet", "tfrecord"])
def test_from_ray_writes_shards_that_verify_and_read_back(fmt: str, tmp_path: Path) -> None:
    import ray.data

    items: list[dict[str, Any]] = []
    for i in range(40):
        items.append(
            {
                "__key__": f"s/{i:03d}",
                "jpg": os.urandom(100 + 997 * (i % 9)),
                "cls": i % 4,  # ints are written as decimal text, as webdataset does
                "txt": f"sample {i} ü" if i % 3 else None,  # str as UTF-8; None: the sample lacks it
            }
        )
    ds = ray.data.from_items(items, override_num_blocks=4).map(lambda row: row)
    report = fastload.from_ray(ds, tmp_path / "out", shard_format=fmt, max_samples=6)
    assert report.index.samples == 40 and fastload.verify(tmp_path / "out").ok
    assert all(s.samples <= 6 for s in report.index.shards) and len(report.index.shards) >= 7
    index = json.loads(
        (tmp_path / "out" / ("_fastload/" if fmt == "parquet" else "") / "index.json").read_bytes()
    )
    assert index["fields"] == ["cls", "jpg", "txt"] and index["options"]["source"] == "ray.data"
    assert index["version"] == 2  # each write task wrote its shards' sample tables
    assert all((tmp_path / "out" / s["table"]["name"]).is_file() for s in index["shards"])
    assert not (tmp_path / "out" / ".fastload-pack").exists()
    want = {
        row["__key__"]: {
            "jpg": row["jpg"],
            "cls": b"%d" % row["cls"],
            **({"txt": row["txt"].encode()} if row["txt"] else {}),
        }
        for row in items
    }
    assert by_key(fastload.to_ray(tmp_path / "out").take_all()) == want


def test_from_ray_refuses_bad_rows_clearly(tmp_path: Path) -> None:
    import ray.data

    no_key = ray.data.from_items([{"name": "a", "jpg": b"x"}])
    with pytest.raises(ConfigError, match=r"no '__key__'"):
        fastload.from_ray(no_key, tmp_path / "a")
    with pytest.raises(ConfigError, match=r"does not take shuffle_seed; shuffle in the pipeline"):
        fastload.from_ray(no_key, tmp_path / "a", shuffle_seed=3)
    floats = ray.data.from_items([{"__key__": "a", "score": 0.5}])
    with pytest.raises(ConfigError, match=r"sample 'a', column 'score': a float value") as raised:
        fastload.from_ray(floats, tmp_path / "b")
    assert "Traceback" not in str(raised.value)
    twice = ray.data.from_items([{"__key__": k, "jpg": b"x"} for k in ("a", "b", "a")], override_num_blocks=3)
    with pytest.raises(PackError, match=r"occur in more than one row, e\.g\. \['a'\]"):
        fastload.from_ray(twice, tmp_path / "c")
    assert not (tmp_path / "c" / "index.json").exists()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep.txt").write_text("mine")
    with pytest.raises(PackError, match=r"is not empty"):
        fastload.from_ray(twice, tmp_path / "d")
