"""Parquet column values as sample values: one conversion per column of a row group read (vectorised, never
per value through Arrow scalars), shared by every Parquet shard, packed or foreign.

=====================================  =====================================================
Arrow type of the column               value in the sample
=====================================  =====================================================
binary, large_binary, fixed_size_binary  ``bytes``
string, large_string                    ``str``
int*, uint*, float*, double, bool       ``int``, ``float``, ``bool``
list, large_list, fixed_size_list       ``numpy.ndarray`` (the element type's dtype; strings:
                                        an object array)
timestamp, date                         ``datetime.datetime`` (tz-aware when the column has a
                                        time zone), ``datetime.date``
decimal, time, duration                 ``decimal.Decimal``, ``datetime.time``, ``datetime.timedelta``
struct, map                             ``dict``, list of ``(key, value)`` tuples
dictionary (pandas categorical)         the value type's conversion
null                                    ``None`` (a foreign file's null; see :func:`sample_rows`)
=====================================  =====================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

KEY_COLUMN = "__key__"
RawSample = dict[str, Any]


def _list_values(array: pa.Array) -> list[Any]:
    """Each list of a (variable or fixed size) list array as one numpy array; a null list is None."""
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        flat = array.values.slice(array.offset * size, len(array) * size)
        values = flat.to_numpy(zero_copy_only=False).reshape(len(array), size)
        rows: list[Any] = list(values)
    else:
        offsets = array.offsets.to_numpy()
        values = array.values.to_numpy(zero_copy_only=False)
        rows = [values[offsets[i] : offsets[i + 1]] for i in range(len(array))]
    if array.null_count:
        for i in np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False)):
            rows[i] = None
    return rows


def _is_list(kind: pa.DataType) -> bool:
    return bool(pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind))


def column_values(column: pa.ChunkedArray | pa.Array) -> list[Any]:
    """One column's values as Python/numpy values (the table in the module docstring)."""
    if not _is_list(column.type):
        return column.to_pylist()  # type: ignore[no-any-return]
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out: list[Any] = []
    for chunk in chunks:
        out += _list_values(chunk)
    return out


def sample_rows(
    table: pa.Table,
    *,
    rows: Sequence[int],
    positions: Sequence[int],
    keys: Sequence[str],
    keep_nulls: bool,
) -> list[RawSample]:
    """The samples at shard positions ``positions`` (in that order, repeats allowed) from ``table``, whose
    row i is the shard's sample ``rows[i]``, as ``{"__key__": key, column: value, "__index__": position}``.
    ``__key__`` is the row's ``__key__`` column when it was read (fastload's shards; the same as the index
    says), else from the index (``keys``). ``keep_nulls``: a null is ``None`` (foreign files); else the
    sample lacks that field (fastload's shards, where a null is a missing member). Made in bulk: one
    conversion per column, then a dict per row from the columns zipped (no per-value Arrow work)."""
    pick: list[int] | None = None  # the table's row of each sample, when not the table's rows in order
    if len(positions) != len(rows) or any(p != r for p, r in zip(positions, rows)):  # noqa: B905
        at = {r: i for i, r in enumerate(rows)}
        pick = [at[p] for p in positions]
        if 2 * len(pick) < len(rows):  # few of the rows: those taken before converting (else every row
            table, pick = table.take(pa.array(pick, pa.int64())), None  # converted, then picked: no copy)

    def picked(values: list[Any]) -> list[Any]:
        return values if pick is None else [values[i] for i in pick]

    names = [n for n in table.column_names if n != KEY_COLUMN]
    if KEY_COLUMN in table.column_names:
        key_values = picked(table.column(KEY_COLUMN).to_pylist())  # (in one go, cheaper than the index's)
    else:
        many = getattr(keys, "take", None)
        key_values = many(positions) if many is not None else [keys[p] for p in positions]
    columns = [key_values, *(picked(column_values(table.column(n))) for n in names), list(positions)]
    fields = [KEY_COLUMN, *names, "__index__"]
    samples = [dict(zip(fields, values)) for values in zip(*columns)]  # noqa: B905 (a name per column)
    if not keep_nulls:  # a null is a missing member: its field left out of that sample
        for n in names:
            column = table.column(n)
            if column.null_count:
                null = column.is_null().to_numpy(zero_copy_only=False)
                for i in np.flatnonzero(null if pick is None else null[pick]):
                    del samples[i][n]
    return samples


def read_columns(names: Sequence[str], columns: Sequence[str] | None) -> list[str] | None:
    """The columns of a file (``names``) to read for a projection ``columns`` (None: all): those asked for
    that it has; never ``__key__``, whose values the index holds."""
    if columns is None:
        return None
    present = set(names)
    return [c for c in dict.fromkeys(columns) if c != KEY_COLUMN and c in present]
