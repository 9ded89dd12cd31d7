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

from collections.abc import Collection, Sequence
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
    first: int,
    wanted: Collection[int],
    keys: Sequence[str],
    keep_nulls: bool,
) -> dict[int, RawSample]:
    """The rows of ``table`` (a row group whose first row is sample ``first`` of its shard) whose sample
    position is in ``wanted``, as samples ``{"__key__": keys[pos], "__index__": pos, column: value}``.
    ``__key__`` is the row's ``__key__`` column when it was read (fastload's shards; the same as the index
    says), else from the index (``keys``). ``keep_nulls``: a null is ``None``
    (foreign files); else the sample lacks that field (fastload's shards, where a null is a missing member).
    """
    picked = [r for r in range(table.num_rows) if first + r in wanted]
    if not picked:
        return {}
    if len(picked) < table.num_rows:
        table = table.take(pa.array(picked, pa.int64()))
    names = [KEY_COLUMN, *(n for n in table.column_names if n != KEY_COLUMN)]
    key_values = (
        table.column(KEY_COLUMN).to_pylist()  # (read anyway: decoded in one go, cheaper than the index's)
        if KEY_COLUMN in table.column_names
        else [keys[first + r] for r in picked]
    )
    columns = [key_values, *(column_values(table.column(n)) for n in names[1:])]
    rows: dict[int, RawSample] = {}
    for r, values in zip(picked, zip(*columns, strict=True), strict=True):
        pos = first + r
        if keep_nulls:
            sample = dict(zip(names, values))  # noqa: B905 (a name per column)
        else:
            sample = {n: v for n, v in zip(names, values) if v is not None}  # noqa: B905
        sample["__index__"] = pos
        rows[pos] = sample
    return rows


def read_columns(names: Sequence[str], columns: Sequence[str] | None) -> list[str] | None:
    """The columns of a file (``names``) to read for a projection ``columns`` (None: all): those asked for
    that it has; never ``__key__``, whose values the index holds."""
    if columns is None:
        return None
    present = set(names)
    return [c for c in dict.fromkeys(columns) if c != KEY_COLUMN and c in present]
