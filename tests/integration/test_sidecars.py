"""fastload's own files in a Parquet dataset (``index.json``, the ``.fltable`` sample tables) live in
``_fastload/``, where pandas, pyarrow.dataset, Spark and DuckDB do not look: after ``fastload index`` of a
pandas hive folder and after ``fastload pack --format parquet``, ``pandas.read_parquet(folder)``,
``pyarrow.dataset.dataset(folder, partitioning="hive")`` and DuckDB's ``read_parquet('folder/**/*.parquet',
hive_partitioning=true)`` read the folder as before (they failed with "Parquet magic bytes not found"). A
Parquet dataset in the older layout (``index.json`` and tables beside the files) still reads, verifies and
inspects, and ``fastload index --upgrade`` moves it; tar datasets keep their layout (index.json beside the
shards, which tar readers never list)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow.dataset as pads
import pytest

import fastload
from fastload.testing.s3serve import S3Server

from .helpers import run_cli

BUCKET = "side"
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


def _frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "split": ["train"] * 7 + ["val"] * 5,
            "x": list(range(12)),
            "text": [f"row {i}" for i in range(12)],
        }
    )


def _others_read(folder: Path) -> dict[str, int]:
    """Rows each other tool reads from ``folder`` (raises as they do when a file is not Parquet)."""
    glob = str(folder / "**" / "*.parquet")
    ((counted,),) = duckdb.sql(
        f"select count(*) from read_parquet('{glob}', hive_partitioning=true)"
    ).fetchall()
    return {
        "pandas": len(pd.read_parquet(folder)),
        "pyarrow": pads.dataset(folder, partitioning="hive").count_rows(),
        "duckdb": counted,
    }


def _outside(folder: Path) -> list[str]:
    """Files of ``folder`` that are not Parquet and not under a ``_``/``.`` name."""
    return sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file()
        and p.suffix != ".parquet"
        and not any(part.startswith(("_", ".")) for part in p.relative_to(folder).parts)
    )


def _parquet_files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.parquet"))


def _old_layout(folder: Path) -> None:
    """What fastload wrote before ``_fastload/``: index.json at the root, each table beside its file."""
    side = folder / "_fastload"
    raw = json.loads((side / "index.json").read_bytes())
    for s in raw["shards"]:
        old = s["table"]["name"].removeprefix("_fastload/")
        (folder / old).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(folder / s["table"]["name"], folder / old)
        s["table"]["name"] = old
    (folder / "index.json").write_bytes(json.dumps(raw).encode())
    shutil.rmtree(side)


@pytest.fixture
def hive(tmp_path: Path) -> Path:
    folder = tmp_path / "hive"
    _frame().to_parquet(folder, partition_cols=["split"])
    assert _others_read(folder) == {"pandas": 12, "pyarrow": 12, "duckdb": 12}
    return folder


@pytest.fixture
def packed(many_tree, tmp_path: Path) -> Path:
    dst = tmp_path / "packed"
    run_cli("pack", many_tree.root, dst, "--format", "parquet", "--shard-size", "8KiB", "--quiet", check=0)
    return dst


def test_fastload_index_leaves_a_pandas_folder_readable_by_pandas_pyarrow_and_duckdb(hive):
    run_cli("index", hive, check=0)
    assert (hive / "_fastload" / "index.json").is_file() and not (hive / "index.json").exists()
    assert _outside(hive) == []
    assert _others_read(hive) == {"pandas": 12, "pyarrow": 12, "duckdb": 12}
    samples = list(fastload.ShardDataset(hive, decode=False))
    assert sorted(s["x"] for s in samples) == list(range(12))
    assert run_cli("verify", hive, check=0).stdout.startswith("OK")
    assert "samples:  12" in run_cli("inspect", hive, check=0).stdout
    run_cli("index", "--force", hive, check=0)  # replaced in place, nothing left beside the files
    assert _outside(hive) == [] and _others_read(hive)["pyarrow"] == 12
    _old_layout(hive)  # an index from before _fastload/, replaced: its files beside the data go too
    assert _outside(hive) == ["index.json", *(f"{p}.fltable" for p in _parquet_files(hive))]
    run_cli("index", "--force", hive, check=0)
    assert _outside(hive) == [] and _others_read(hive) == {"pandas": 12, "pyarrow": 12, "duckdb": 12}


def test_fastload_pack_parquet_output_is_readable_by_pandas_pyarrow_and_duckdb(packed):
    assert (packed / "_fastload" / "index.json").is_file() and _outside(packed) == []
    n = len(fastload.ShardDataset(packed))
    assert n == 200 and _others_read(packed) == {"pandas": n, "pyarrow": n, "duckdb": n}
    keys = sorted(s["__key__"] for s in fastload.ShardDataset(packed))
    assert sorted(pd.read_parquet(packed)["__key__"]) == keys
    assert run_cli("verify", packed, check=0).stdout.startswith("OK")
    first = json.loads((packed / "_fastload" / "index.json").read_bytes())["shards"][0]
    assert first["table"]["name"] == f"_fastload/{first['name']}.fltable"
    assert run_cli("verify", packed / first["name"], check=0).stdout.startswith("OK: 1 shards checked")


def test_tar_datasets_keep_index_json_beside_the_shards(many_tree, tmp_path):
    dst = tmp_path / "tars"
    fastload.pack(many_tree.root, dst, shard_size_bytes=8 << 10, progress=False)
    raw = json.loads((dst / "index.json").read_bytes())
    assert not (dst / "_fastload").exists() and raw["shards"][0]["table"]["name"].endswith(".tar.fltable")
    assert "/" not in raw["shards"][0]["table"]["name"]


def test_the_older_parquet_layout_still_reads_and_upgrade_moves_it(packed):
    expected = sorted(s["__key__"] for s in fastload.ShardDataset(packed, decode=False))
    _old_layout(packed)
    with pytest.raises(ValueError, match="magic bytes"):  # the trouble the older layout gives other tools
        pd.read_parquet(packed)
    assert sorted(s["__key__"] for s in fastload.ShardDataset(packed, decode=False)) == expected
    assert run_cli("verify", packed, check=0).stdout.startswith("OK")
    assert "samples:  200" in run_cli("inspect", packed, check=0).stdout
    out = run_cli("index", "--upgrade", packed, check=0).stdout
    assert "moved index.json and" in out and "_fastload/" in out, out
    assert not (packed / "index.json").exists() and _outside(packed) == []
    assert _others_read(packed)["pandas"] == 200
    assert sorted(s["__key__"] for s in fastload.ShardDataset(packed, decode=False)) == expected
    assert run_cli("verify", packed, check=0).stdout.startswith("OK")
    assert "nothing to upgrade" in run_cli("index", "--upgrade", packed, check=0).stdout


@pytest.mark.parametrize("layout", ["new", "old"])
def test_s3_readers_verify_inspect_and_cp_follow_both_layouts(packed, tmp_path, monkeypatch, layout):
    for name, value in CREDS.items():
        monkeypatch.setenv(name, value)
    expected = sorted(s["__key__"] for s in fastload.ShardDataset(packed, decode=False))
    if layout == "old":
        _old_layout(packed)
    bucket = tmp_path / "bucket"
    shutil.copytree(packed, bucket / "ds")
    with S3Server(bucket, bucket=BUCKET) as server:
        env = {"AWS_ENDPOINT_URL": server.endpoint_url, **CREDS}
        config = fastload.S3Config(endpoint_url=server.endpoint_url, addressing_style="path")
        url = f"s3://{BUCKET}/ds"
        keys = sorted(s["__key__"] for s in fastload.ShardDataset(url, decode=False, s3_config=config))
        assert keys == expected
        assert run_cli("verify", url, check=0, **env).stdout.startswith("OK")
        assert "samples:  200" in run_cli("inspect", url, check=0, **env).stdout
        down = tmp_path / "down"
        run_cli("cp", "-r", url + "/", down, "--quiet", check=0, **env)
    assert sorted(s["__key__"] for s in fastload.ShardDataset(down, decode=False)) == expected
    assert (down / "_fastload" / "index.json").is_file() == (layout == "new")
