"""Column statistics of Parquet shards: per row group from the footer (what filters prune row groups by)
and per shard for the v2 manifest (what filters prune shards by without fetching anything), and which
columns ``fastload pack`` writes statistics for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastload.core import filters as F

# A column whose values in a shard are all at most this long gets statistics written (min/max per row
# group and per shard): labels, ids, dates, short text; not images or token arrays.
STATS_MAX_VALUE_BYTES = 64


def column_stats(meta: Any, group: int, columns: Sequence[str]) -> dict[str, F.ColumnStats]:
    """The footer statistics of row group ``group`` for the top-level, non-nested ``columns``."""
    rg = meta.row_group(group)
    out: dict[str, F.ColumnStats] = {}
    wanted = set(columns)
    for c in range(rg.num_columns):
        col = rg.column(c)
        if col.path_in_schema not in wanted or not col.is_stats_set:
            continue
        s = col.statistics
        nulls = s.null_count if s.has_null_count else None
        lo, hi = (s.min, s.max) if s.has_min_max else (None, None)
        out[col.path_in_schema] = F.ColumnStats(lo, hi, nulls, rg.num_rows)
    return out


def shard_stats(meta: Any) -> dict[str, list[Any]]:
    """``{column: [min, max, nulls]}`` over every row group, for columns whose every row group has
    statistics, with JSON values (bytes as UTF-8 text, which orders as the bytes do; dates as ISO
    text), for the v2 manifest entry. Columns whose values do not fit are left out."""
    groups = range(meta.num_row_groups)
    if not groups:
        return {}
    names = [meta.row_group(0).column(c).path_in_schema for c in range(meta.row_group(0).num_columns)]
    out: dict[str, list[Any]] = {}
    for name in names:
        per = [column_stats(meta, g, [name]).get(name) for g in groups]
        if any(s is None or s.nulls is None for s in per):
            continue
        present = [s for s in per if s is not None and s.min is not None]
        nulls = sum(s.nulls or 0 for s in per if s is not None)
        lo = min((s.min for s in present), default=None)
        hi = max((s.max for s in present), default=None)
        values = [_json_value(lo), _json_value(hi)]
        if all(v is not _UNFIT for v in values):
            out[name] = [*values, nulls]
    return out


_UNFIT = object()


def _json_value(v: Any) -> Any:
    if v is None or isinstance(v, (int, float, str)):
        return v
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return _UNFIT
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return _UNFIT
