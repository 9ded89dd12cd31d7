"""Helpers of the foreign Parquet tests (a module of its own: each tests/*/conftest.py is `conftest`)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

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
