"""Row filters in pyarrow's DNF convention, and what they say about a row, a partition or a column's
statistics. Pure: the readers supply partition values (``core.filters.partition_values``) and statistics
(the v2 manifest's per-shard min/max, Parquet footers' per-row-group ones).

A filter is a list of ``(column, op, value)`` tuples, all of which must hold (AND), or a list of such lists,
any of which must hold (OR); ``op`` is one of ``= == != < <= > >= in not in`` (``=`` is ``==``; ``in`` and
``not in`` take a collection). Null semantics are pyarrow's (``pyarrow.parquet.filters_to_expression``): a
comparison with a null (on either side) is false, ``in`` matches a null only when the collection holds
``None``, ``not in`` is the negation of ``in`` (so a null row is ``not in`` a collection without ``None``).

Against partition values or statistics a filter gives a :data:`Verdict`: :data:`NONE` (no row can match:
skip the shard or row group unread), :data:`ALL` (every row matches: no need to look at rows) or
:data:`SOME` (rows must be looked at). A column neither in the partition nor in the statistics, or
statistics missing, give :data:`SOME`: "may match" is always safe.
"""

from __future__ import annotations

import datetime
import operator
import re
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastload.errors import ConfigError

Verdict = int
NONE, SOME, ALL = 0, 1, 2
OPS = ("==", "!=", "<", "<=", ">", ">=", "in", "not in")
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"  # pyarrow's (and Hive's) name for a null partition value
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_INT = re.compile(r"-?[0-9]+\Z")


@dataclass(frozen=True)
class Predicate:
    """``column op value``; for ``in``/``not in`` the value is a tuple."""

    column: str
    op: str
    value: Any

    def as_tuple(self) -> tuple[str, str, Any]:
        return (self.column, self.op, list(self.value) if isinstance(self.value, tuple) else self.value)


Filter = tuple[tuple[Predicate, ...], ...]  # OR of ANDs


@dataclass(frozen=True)
class ColumnStats:
    """What is known of a column's values in a shard or row group: ``min``/``max`` of its non-null values
    (None: unknown), ``nulls`` (None: unknown) out of ``rows`` values (None: unknown)."""

    min: Any = None
    max: Any = None
    nulls: int | None = None
    rows: int | None = None


def _predicate(raw: Any) -> Predicate:
    if not isinstance(raw, (tuple, list)) or len(raw) != 3:
        raise ConfigError(f"filters: {raw!r} is not a (column, op, value) tuple")
    column, op, value = raw
    if not isinstance(column, str) or not column:
        raise ConfigError(f"filters: {raw!r}: the column must be a non-empty string")
    op = "==" if op == "=" else op
    if op not in OPS:
        raise ConfigError(f"filters: {raw!r}: op {op!r}; choose one of =, {', '.join(OPS)}")
    if op in ("in", "not in"):
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
            raise ConfigError(f"filters: {raw!r}: {op!r} takes a list, set or tuple of values")
        value = tuple(value)
    elif isinstance(value, (list, set, tuple, dict)):
        raise ConfigError(f"filters: {raw!r}: {op!r} compares with one value; use 'in' for several")
    return Predicate(column, op, value)


def normalise(filters: Any) -> Filter | None:
    """``filters`` (pyarrow's DNF: a list of tuples, or a list of lists of tuples) as a :data:`Filter`;
    None or an empty list: None (no filter). Raises :class:`ConfigError` saying what is wrong."""
    if filters is None:
        return None
    if isinstance(filters, tuple) and all(
        isinstance(c, tuple) and c and isinstance(c[0], Predicate) for c in filters
    ):
        return filters  # already normalised
    if not isinstance(filters, (list, tuple)):
        raise ConfigError(f"filters={filters!r}: give a list of (column, op, value) tuples or of such lists")
    if not filters:
        return None
    nested = [isinstance(f, list) for f in filters]
    if any(nested) and not all(nested):
        raise ConfigError("filters: mix of tuples and lists; give tuples (AND) or lists of tuples (OR)")
    clauses = filters if all(nested) else [filters]
    out = []
    for clause in clauses:
        if not clause:
            raise ConfigError("filters: an empty list of conditions inside the OR list")
        out.append(tuple(_predicate(p) for p in clause))
    return tuple(out)


def and_filters(a: Filter | None, b: Filter | None) -> Filter | None:
    """``a AND b`` (distributed into DNF)."""
    if a is None or b is None:
        return a if b is None else b
    return tuple(x + y for x in a for y in b)


def describe(f: Filter | None) -> list[list[tuple[str, str, Any]]] | None:
    """``f`` as plain lists of tuples (what a checkpoint records, and messages show)."""
    return None if f is None else [[p.as_tuple() for p in clause] for clause in f]


def columns_of(f: Filter | None) -> list[str]:
    """The columns ``f`` reads, sorted."""
    return sorted({p.column for clause in f for p in clause}) if f is not None else []


def coerce(value: Any, like: Any, *, column: str) -> Any:
    """``value`` as a value comparable with ``like`` (a value of the column): text and bytes convert
    (UTF-8), dates from ISO strings; :class:`ConfigError` when they cannot be compared."""
    if value is None or like is None:
        return value
    if isinstance(like, bytes) and isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(like, str) and isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(like, str) and isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(like, datetime.datetime) and isinstance(value, str):
        return datetime.datetime.fromisoformat(value)
    if isinstance(like, datetime.date) and isinstance(value, str):
        return datetime.date.fromisoformat(value)
    numbers = (int, float)
    if isinstance(like, numbers) and isinstance(value, numbers):
        return value
    if type(value) is not type(like) and not (
        isinstance(like, datetime.date) and isinstance(value, datetime.date)
    ):
        raise ConfigError(
            f"filters: column {column!r} holds {type(like).__name__} values (e.g. {like!r}), the filter "
            f"compares it with {value!r} ({type(value).__name__}); give a {type(like).__name__}"
        )
    return value


def holds(p: Predicate, x: Any) -> bool:
    """Whether the value ``x`` (None: null) satisfies ``p`` (pyarrow's null semantics)."""
    if p.op == "in":
        return any(
            x is None if v is None else (x is not None and x == coerce(v, x, column=p.column))
            for v in p.value
        )
    if p.op == "not in":
        return not holds(Predicate(p.column, "in", p.value), x)
    if x is None or p.value is None:
        return False
    return _COMPARE[p.op](x, coerce(p.value, x, column=p.column))


def matches(f: Filter, row: Mapping[str, Any]) -> bool:
    """Whether ``row`` (column -> value; a missing column is null) satisfies ``f``."""
    return any(all(holds(p, row.get(p.column)) for p in clause) for clause in f)


def _on_stats(p: Predicate, s: ColumnStats) -> Verdict:
    """What ``p`` can say of values described by ``s``."""
    all_null = s.nulls is not None and s.rows is not None and s.nulls >= s.rows
    no_nulls = s.nulls == 0
    nulls_match = holds(p, None)  # does a null row satisfy p?
    if all_null:
        return ALL if nulls_match else NONE
    if s.min is None or s.max is None:
        return SOME
    lo, hi = s.min, s.max
    nulls_ok = no_nulls or nulls_match  # (ALL needs every null row to match too)
    nulls_none = no_nulls or not nulls_match  # (NONE needs no null row to match)
    if p.op in ("in", "not in"):
        values = [coerce(v, lo, column=p.column) for v in p.value if v is not None]
        hits = [v for v in values if lo <= v <= hi]
        constant_in = lo == hi and lo in values
        if p.op == "in":
            if not hits and nulls_none:
                return NONE
            return ALL if constant_in and nulls_ok else SOME
        if constant_in and nulls_none:
            return NONE
        return ALL if not hits and nulls_ok else SOME
    if p.value is None:
        return NONE if nulls_none else SOME
    v = coerce(p.value, lo, column=p.column)
    none, every = {
        "==": (v < lo or v > hi, lo == hi == v),
        "!=": (lo == hi == v, v < lo or v > hi),
        "<": (lo >= v, hi < v),
        "<=": (lo > v, hi <= v),
        ">": (hi <= v, lo > v),
        ">=": (hi < v, lo >= v),
    }[p.op]
    if none and nulls_none:
        return NONE
    return ALL if every and no_nulls else SOME


def verdict(
    f: Filter, *, partition: Mapping[str, Any] | None = None, stats: Mapping[str, ColumnStats] | None = None
) -> Verdict:
    """What ``f`` says of a set of rows sharing the ``partition`` values (exact) and described by
    ``stats`` (per column; a column in neither: :data:`SOME`)."""
    partition, stats = partition or {}, stats or {}

    def one(p: Predicate) -> Verdict:
        if p.column in partition:
            return ALL if holds(p, partition[p.column]) else NONE
        s = stats.get(p.column)
        return SOME if s is None else _on_stats(p, s)

    return max(min(one(p) for p in clause) for clause in f)


def parse_partition(partition: str | None) -> dict[str, str | None]:
    """``"year=2024/month=01"`` -> ``{"year": "2024", "month": "01"}`` (values URL-decoded as pyarrow's hive
    partitioning does; ``__HIVE_DEFAULT_PARTITION__`` is null). Segments without ``=`` are ignored."""
    out: dict[str, str | None] = {}
    for segment in (partition or "").split("/"):
        key, eq, value = segment.partition("=")
        if eq and key:
            text = urllib.parse.unquote(value)
            out[urllib.parse.unquote(key)] = None if text == HIVE_NULL else text
    return out


def partition_types(partitions: Iterable[str | None]) -> dict[str, type]:
    """Each partition column's type across a dataset, as pyarrow's hive partitioning infers it: ``int``
    when every (non-null) value is an integer, else ``str``."""
    types: dict[str, type] = {}
    for partition in partitions:
        for key, value in parse_partition(partition).items():
            if value is None:
                types.setdefault(key, int)
            elif types.get(key, int) is int:
                types[key] = int if _INT.match(value) else str
    return types


def partition_values(partition: str | None, types: Mapping[str, type]) -> dict[str, Any]:
    """The typed values of one shard's partition (``types``: :func:`partition_types` of its dataset)."""
    return {
        k: (int(v) if types.get(k) is int and v is not None else v)
        for k, v in parse_partition(partition).items()
    }


def check_columns(f: Filter, known: Sequence[str], *, where: str) -> None:
    """:class:`ConfigError` naming a column of ``f`` not among ``known`` (the dataset's fields and
    partition columns)."""
    unknown = [c for c in columns_of(f) if c not in known]
    if unknown:
        raise ConfigError(
            f"filters name {', '.join(map(repr, unknown))}, not a column of {where}; its columns: "
            f"{', '.join(sorted(known))}"
        )
