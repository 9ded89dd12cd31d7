"""Which rows of a Parquet shard a filter keeps (:mod:`fastload.core.filters`), decided before the rows
are read for training: each row group's footer statistics first (a group no row of which can match is
never fetched, one all of whose rows match is kept whole), then, for the groups the statistics leave
undecided, only the filter's columns are fetched (a projected read) and evaluated by pyarrow's compute
kernels (:func:`row_mask`; not an expression, whose evaluation imports pyarrow's dataset engine). So the
planner knows each shard's exact count of kept rows, and the even policies, exactly-once splitting and
resume work on the filtered dataset as on any other."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fastload.core import filters as F
from fastload.core.selection import from_mask
from fastload.errors import ConfigError
from fastload.formats.parquet.stats import column_stats

_OPS = {
    "==": "equal",
    "!=": "not_equal",
    "<": "less",
    "<=": "less_equal",
    ">": "greater",
    ">=": "greater_equal",
}


def _value(value: Any, type_: Any, p: F.Predicate) -> Any:
    import pyarrow as pa

    try:
        return pa.scalar(value, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        raise ConfigError(
            f"filters: column {p.column!r} holds {type_} values, the filter compares it with {value!r}; give "
            "a value of that type"
        ) from None


def row_mask(table: Any, flt: F.Filter, partition: Mapping[str, Any]) -> Any:
    """Which rows of ``table`` (the filter's columns) ``flt`` keeps, as a numpy bool array, with pyarrow's
    compute kernels and null semantics (as ``pyarrow.parquet.filters_to_expression`` gives: a comparison
    with a null is false, ``in`` matches a null only when the values hold ``None``, ``not in`` is its
    negation); ``partition``: the shard's partition values (its columns are constants)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows

    def one(p: F.Predicate) -> Any:
        if p.column in partition:
            return np.full(n, F.holds(p, partition[p.column]))
        col = table.column(p.column)
        if p.op in ("in", "not in"):
            values = pa.array([_value(v, col.type, p).as_py() for v in p.value], type=col.type)
            hit = pc.is_in(col, value_set=values, skip_nulls=False).to_numpy(zero_copy_only=False)
            return hit if p.op == "in" else ~hit
        if p.value is None:
            return np.zeros(n, dtype=bool)
        got = getattr(pc, _OPS[p.op])(col, _value(p.value, col.type, p))
        return pc.fill_null(got, False).to_numpy(zero_copy_only=False)

    keep = np.zeros(n, dtype=bool)
    for clause in flt:
        every = np.ones(n, dtype=bool)
        for p in clause:
            every &= one(p)
        keep |= every
    return keep


def select_rows(
    source: Any, flt: F.Filter, partition: Mapping[str, Any]
) -> tuple[list[tuple[int, int]], int]:
    """``(runs of kept rows, bytes fetched)`` of the shard ``source`` (a ``ParquetSamples``) under ``flt``
    (see the module)."""
    meta = source.metadata()
    cols = [c for c in F.columns_of(flt) if c not in partition]
    starts = source.row_starts
    runs: list[tuple[int, int]] = []
    undecided: list[int] = []
    for g in range(meta.num_row_groups):
        verdict = F.verdict(flt, partition=partition, stats=column_stats(meta, g, cols))
        if verdict == F.ALL:
            runs.append((starts[g], starts[g + 1]))
        elif verdict == F.SOME:
            undecided.append(g)
    if not undecided:
        return runs, 0
    pieces = source.fetch(meta, undecided, cols)
    for g in undecided:
        runs += from_mask(row_mask(source.decode(meta, pieces, g, cols), flt, partition), starts[g])
    return runs, sum(len(b) for _, b in pieces)
