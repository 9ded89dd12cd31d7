"""Fixtures for the foreign Parquet tests: folders of Parquet files written by other tools, made once per
module (tiny: a few rows each, several row groups, so reads cross row groups and files).

- ``hive``: pyarrow files in ``year=YYYY/month=MM/`` folders (three row groups of 2 rows per file; every
  column type the value table documents), plus what Spark and friends leave next to them (``_SUCCESS``, a
  hidden ``.crc``, an unfinished ``_temporary/`` file) that must be left out.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

PARTS = [(2023, 12), (2024, 1), (2024, 2)]
ROWS = 5  # per file


@dataclass
class Hive:
    root: Path
    rows: dict[str, dict[str, Any]]  # derived key -> the row's columns
    partitions: dict[str, str]  # file name -> partition


def hive_table(year: int, month: int, rows: int = ROWS) -> pa.Table:
    first = datetime.datetime(year, month, 1, tzinfo=datetime.timezone.utc)
    return pa.table(
        {
            "id": [f"{year}-{month:02d}-{i}" for i in range(rows)],
            "label": pa.array([i % 3 for i in range(rows)], pa.int32()),
            "score": [i / 4 for i in range(rows)],
            "ok": [i % 2 == 0 for i in range(rows)],
            "jpg": [bytes([i]) * (i + 1) for i in range(rows)],
            "tags": pa.array([[f"t{j}" for j in range(i)] for i in range(rows)], pa.list_(pa.string())),
            "emb": pa.array([[float(i), -float(i)] for i in range(rows)], pa.list_(pa.float32(), 2)),
            "ts": [first + datetime.timedelta(days=i) for i in range(rows)],
            "day": [first.date() + datetime.timedelta(days=i) for i in range(rows)],
            "note": [None if i % 2 else f"n{i}" for i in range(rows)],
        }
    )


@pytest.fixture(scope="module")
def hive(tmp_path_factory: pytest.TempPathFactory) -> Hive:
    root = tmp_path_factory.mktemp("hive") / "events"
    rows: dict[str, dict[str, Any]] = {}
    partitions: dict[str, str] = {}
    for year, month in PARTS:
        folder = root / f"year={year}" / f"month={month:02d}"
        folder.mkdir(parents=True)
        table = hive_table(year, month)
        name = f"year={year}/month={month:02d}/part-00000.parquet"
        pq.write_table(table, root / name, row_group_size=2)
        partitions[name] = f"year={year}/month={month:02d}"
        for i, row in enumerate(table.to_pylist()):
            rows[f"{name[: -len('.parquet')]}/{i:06d}"] = row
        (folder / ".part-00000.parquet.crc").write_bytes(b"crc")
    (root / "_SUCCESS").write_bytes(b"")
    (root / "_temporary" / "0").mkdir(parents=True)
    (root / "_temporary" / "0" / "part-9.parquet").write_bytes(b"PAR1 half written")
    return Hive(root, rows, partitions)
