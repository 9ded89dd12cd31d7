"""Which pack sources are tables (packed a row a sample by :mod:`fastload.packing.tabular`), told by name
alone: a module of its own, so that a pack of files asks without importing ``tabular`` (and with it pyarrow
and numpy: 0.1 CPU s, 0.2-0.4 s, a tenth of a small tar pack)."""

from __future__ import annotations

TABLE_SUFFIXES = (".parquet", ".csv", ".jsonl", ".ndjson")


def is_table(url: str) -> bool:
    return url.lower().endswith(TABLE_SUFFIXES)
