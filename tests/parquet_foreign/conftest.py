"""Fixtures for the foreign Parquet tests: folders of Parquet files written by other tools, made once per
module (tiny: a few rows each, several row groups, so reads cross row groups and files).

- ``hive``: pyarrow files in ``year=YYYY/month=MM/`` folders (three row groups of 2 rows per file; every
  column type the value table documents), plus what Spark and friends leave next to them (``_SUCCESS``, a
  hidden ``.crc``, an unfinished ``_temporary/`` file) that must be left out.
"""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq
import pytest
from pqf_helpers import PARTS, Hive, hive_table


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
