"""The Parquet format's own per-shard data in the index (its payload, :class:`ParquetShard`): the shard's
footer (its Thrift ``FileMetaData``, in the sample table's ``footer`` column, so a projected read knows each
column chunk's bytes without reading the file's tail) and its column statistics (``stats`` in the shard's
``index.json`` object: ``{column: [min, max, nulls]}``, so filters skip shards without reading their
tables). Its row groups are core's (``ShardEntry.row_groups``: the groups core's read planner reads whole)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastload.core.index import ShardEntry
from fastload.core.payload import ShardPayload


@dataclass(frozen=True)
class ParquetShard:
    """A Parquet shard's footer (``b""``: not recorded, read from the file's tail) and statistics."""

    footer: bytes = b""
    stats: dict[str, list[Any]] = field(default_factory=dict)

    def manifest(self, *, listed: bool) -> dict[str, Any]:
        return {"stats": self.stats} if self.stats and not listed else {}

    def table(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {}, ({"footer": np.frombuffer(self.footer, dtype=np.uint8)} if self.footer else {})

    def nbytes(self) -> int:
        return len(self.footer) + 100 * len(self.stats)

    def slim(self) -> ShardPayload | None:
        return ParquetShard(b"", self.stats) if self.stats else None  # (a footer is read again from the file)


def footer_of(entry: ShardEntry) -> bytes:
    """The footer recorded for ``entry``'s shard, or ``b""``."""
    payload = entry.payload
    return payload.footer if isinstance(payload, ParquetShard) else b""


def check_stats(stats: Any) -> dict[str, list[Any]]:
    """``stats`` as index.json holds them, checked (:class:`ValueError` if they are not)."""
    if not isinstance(stats, dict) or not all(
        isinstance(v, list) and len(v) == 3 and type(v[2]) is int for v in stats.values()
    ):
        raise ValueError("'stats' must map columns to [min, max, nulls]")
    return stats


def stats_of(entry: ShardEntry) -> dict[str, list[Any]]:
    """``entry``'s column statistics: its payload's, else as its index.json object has them (a detached
    entry: not read into a payload until its table is attached)."""
    payload = entry.payload
    if isinstance(payload, ParquetShard):
        return payload.stats
    return check_stats(entry.extra.get("stats", {}))


def read_parquet_payload(entry: ShardEntry) -> ParquetShard | None:
    """``ShardFormat.read_payload`` of Parquet: the footer from the sample table, the statistics from
    index.json (checked); None when neither is there."""
    stats = check_stats(entry.extra.get("stats", {}))
    stored = entry.table_extra
    column = stored.columns.get("footer") if stored is not None else None
    if column is not None and (column.ndim != 1 or column.dtype.itemsize != 1):
        raise ValueError("the sample table's footer column is not bytes")
    raw = column.tobytes() if column is not None else b""
    return ParquetShard(raw, stats) if raw or stats else None
