"""core.filters, core.selection and core.projection: filters normalised and refused as pyarrow's DNF is, row
evaluation equal to pyarrow's (nulls included), statistics verdicts that never prune a matching row nor
call a row group whole that is not, partitions typed as pyarrow's hive partitioning types them; kept-row
runs and coalesced byte ranges."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.core import filters as F
from fastload.core import selection
from fastload.core.projection import coalesce
from fastload.errors import ConfigError
from fastload.formats.parquet.select import row_mask

OPS = ["=", "==", "!=", "<", "<=", ">", ">=", "in", "not in"]
values = st.sampled_from([None, -2, -1, 0, 1, 2])  # (nulls one in six: null-free groups are common)
columns = st.lists(values, min_size=1, max_size=8)


@st.composite
def predicates(draw: st.DrawFn, column: str = "a") -> tuple[str, str, object]:
    op = draw(st.sampled_from(OPS))
    if op in ("in", "not in"):
        return (column, op, draw(st.lists(values, max_size=3)))
    return (column, op, draw(st.integers(-2, 3)))


@settings(max_examples=150, deadline=None)
@given(
    rows=columns,
    other=columns,
    f=st.lists(
        st.lists(st.one_of(predicates("a"), predicates("b")), min_size=1, max_size=3), min_size=1, max_size=3
    ),
)
def test_rows_match_as_pyarrow_filters_them(rows: list, other: list, f: list) -> None:
    n = min(len(rows), len(other))
    table = pa.table({"a": pa.array(rows[:n], pa.int64()), "b": pa.array(other[:n], pa.int64())})
    expr = pq.filters_to_expression([[(c, "==" if o == "=" else o, v) for c, o, v in clause] for clause in f])
    want = table.filter(expr).to_pylist()
    flt = F.normalise(f)
    assert flt is not None
    assert [r for r in table.to_pylist() if F.matches(flt, r)] == want


@settings(max_examples=200, deadline=None)
@given(
    rows=columns,
    f=st.lists(st.lists(predicates("a"), min_size=1, max_size=2), min_size=1, max_size=2),
    known=st.booleans(),
)
def test_statistics_never_prune_a_match_nor_call_a_mixed_group_whole(
    rows: list, f: list, known: bool
) -> None:
    flt = F.normalise(f)
    assert flt is not None
    stats = _stats(rows, known)
    present = [x for x in rows if x is not None]
    hits = [F.matches(flt, {"a": x}) for x in rows]
    v = F.verdict(flt, stats={"a": stats})
    if v == F.NONE:
        assert not any(hits)
    if v == F.ALL:
        assert all(hits)
    # statistics of a constant, null-free column are exact
    if present and len(set(rows)) == 1 and known:
        assert v == (F.ALL if hits[0] else F.NONE)


@settings(max_examples=100, deadline=None)
@given(
    rows=columns,
    f=st.lists(
        st.lists(st.one_of(predicates("a"), predicates("s")), min_size=1, max_size=3), min_size=1, max_size=2
    ),
    month=st.integers(1, 2),
)
def test_parquet_row_masks_keep_what_pyarrow_expressions_keep(rows: list, f: list, month: int) -> None:
    """formats.parquet.select.row_mask (compute kernels) against pyarrow's own expression filter, on an
    int column with nulls, a binary column compared with text, and a partition column."""
    texts = [None if x is None else str(x).encode() for x in rows]
    table = pa.table({"a": pa.array(rows, pa.int64()), "s": pa.array(texts, pa.binary())})
    f = [[(c, o, _text(v) if c == "s" else v) for c, o, v in clause] for clause in f] + [[("m", "==", 2)]]
    want = table.append_column("m", pa.array([month] * len(rows))).filter(
        pq.filters_to_expression([[(c, "==" if o == "=" else o, v) for c, o, v in cl] for cl in f])
    )
    flt = F.normalise(f)
    assert flt is not None
    assert (
        table.filter(pa.array(row_mask(table, flt, {"m": month}))).to_pylist()
        == want.drop_columns("m").to_pylist()
    )


def _text(v: object) -> object:
    return [None if x is None else str(x) for x in v] if isinstance(v, list) else str(v)


def _stats(rows: list, known: bool) -> F.ColumnStats:
    present = [x for x in rows if x is not None]
    return F.ColumnStats(
        min=min(present) if present else None,
        max=max(present) if present else None,
        nulls=len(rows) - len(present) if known else None,
        rows=len(rows) if known else None,
    )


def test_statistics_verdicts_exhaustively_on_small_groups() -> None:
    """Every group of up to 3 values of {null, -1, 0, 1}, every single predicate: sound, and exact where
    the statistics determine the answer (null counts known and the values constant)."""
    domain = [None, -1, 0, 1]
    groups = [list(g) for n in (1, 2, 3) for g in itertools.combinations_with_replacement(domain, n)]
    sets = [list(c) for n in (0, 1, 2) for c in itertools.combinations(domain, n)]
    preds = [("a", op, v) for op in OPS[1:7] for v in (-2, -1, 0, 1, 2)]
    preds += [("a", op, s) for op in ("in", "not in") for s in sets]
    for rows, raw, known in itertools.product(groups, preds, (True, False)):
        flt = F.normalise([raw])
        assert flt is not None
        hits = [F.matches(flt, {"a": x}) for x in rows]
        v = F.verdict(flt, stats={"a": _stats(rows, known)})
        assert v != F.NONE or not any(hits), (rows, raw, known)
        assert v != F.ALL or all(hits), (rows, raw, known)
        if known and len(set(rows)) == 1:
            assert v == (F.ALL if hits[0] else F.NONE), (rows, raw)


def test_missing_statistics_and_unknown_columns_may_match() -> None:
    flt = F.normalise([("a", ">", 3)])
    assert flt is not None
    assert F.verdict(flt) == F.SOME
    assert F.verdict(flt, stats={"a": F.ColumnStats()}) == F.SOME
    assert F.verdict(flt, stats={"a": F.ColumnStats(min=0, max=9, nulls=None)}) == F.SOME
    assert F.verdict(flt, stats={"a": F.ColumnStats(min=0, max=3)}) == F.NONE
    assert F.verdict(flt, stats={"a": F.ColumnStats(min=4, max=9, nulls=0, rows=5)}) == F.ALL
    assert F.verdict(flt, stats={"a": F.ColumnStats(min=4, max=9, nulls=1, rows=5)}) == F.SOME
    assert F.verdict(flt, stats={"a": F.ColumnStats(nulls=5, rows=5)}) == F.NONE


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("a > 1", "list of"),
        ([("a", "~", 1)], "op"),
        ([("a", "in", 3)], "list, set or tuple"),
        ([("a", "in", "abc")], "list, set or tuple"),
        ([("a", "==", [1, 2])], "use 'in'"),
        ([("a", 1)], "tuple"),
        ([("", "==", 1)], "non-empty"),
        ([("a", "==", 1), [("b", "==", 2)]], "mix"),
        ([[]], "empty"),
    ],
)
def test_bad_filters_are_refused_saying_why(bad: object, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        F.normalise(bad)


def test_normal_forms() -> None:
    assert F.normalise(None) is None and F.normalise([]) is None
    one = F.normalise([("a", "=", 1), ("b", "in", {2})])
    assert F.describe(one) == [[("a", "==", 1), ("b", "in", [2])]]
    assert F.normalise(one) == one
    two = F.normalise([[("a", "==", 1)], [("b", "<", 2)]])
    assert F.columns_of(two) == ["a", "b"]
    assert F.describe(F.and_filters(two, F.normalise([("c", "==", "x")]))) == [
        [("a", "==", 1), ("c", "==", "x")],
        [("b", "<", 2), ("c", "==", "x")],
    ]


def test_partitions_are_typed_as_pyarrow_hive_partitioning_types_them() -> None:
    parts = ["year=2024/month=01", "year=2024/month=11", "year=2025/month=x%2Fy", None]
    types = F.partition_types(parts)
    assert types == {"year": int, "month": str}
    assert F.partition_values(parts[0], types) == {"year": 2024, "month": "01"}
    assert F.partition_values(parts[2], types) == {"year": 2025, "month": "x/y"}
    assert F.partition_values("split=__HIVE_DEFAULT_PARTITION__", {"split": str}) == {"split": None}
    flt = F.normalise([("year", ">=", 2025)])
    assert flt is not None
    assert F.verdict(flt, partition=F.partition_values(parts[0], types)) == F.NONE
    assert F.verdict(flt, partition=F.partition_values(parts[2], types)) == F.ALL
    with pytest.raises(ConfigError, match="column 'year' holds int"):
        F.verdict(F.normalise([("year", "==", "2024")]) or (), partition={"year": 2024})


def test_text_and_bytes_compare_as_utf8() -> None:
    flt = F.normalise([("d", ">=", "2024-03")])
    assert flt is not None
    assert F.matches(flt, {"d": b"2024-03-02"}) and not F.matches(flt, {"d": b"2024-02-28"})
    assert F.verdict(flt, stats={"d": F.ColumnStats(min="2024-01-01", max="2024-02-28")}) == F.NONE


@settings(max_examples=100, deadline=None)
@given(mask=st.lists(st.booleans(), max_size=40), offset=st.integers(0, 5))
def test_kept_rows_map_to_their_shard_rows(mask: list[bool], offset: int) -> None:
    runs = selection.from_mask(mask, offset)
    s = selection.spans(runs + runs[:1])
    kept = [offset + i for i, m in enumerate(mask) if m]
    assert selection.count(s) == len(kept)
    assert selection.rows_at(s, range(len(kept))).tolist() == kept


@settings(max_examples=100, deadline=None)
@given(
    ranges=st.lists(st.tuples(st.integers(0, 500), st.integers(0, 60)).map(lambda t: (t[0], t[0] + t[1]))),
    gap=st.integers(0, 50),
)
def test_coalesced_ranges_cover_each_range_once(ranges: list[tuple[int, int]], gap: int) -> None:
    out = coalesce(ranges, gap_bytes=gap)
    for a, b in ranges:
        if b > a:
            assert sum(1 for x, y in out if x <= a and b <= y) == 1
    assert all(y > x for x, y in out)
    assert all(out[i + 1][0] - out[i][1] > gap for i in range(len(out) - 1))
    covered = {i for a, b in ranges for i in range(a, b)}
    for x, y in out:  # each output starts and ends on bytes asked for
        assert x in covered and y - 1 in covered
    runs = len(selection.from_mask([i in covered for i in range(600)]))
    assert sum(y - x for x, y in out) <= len(covered) + gap * (runs - len(out))


@settings(max_examples=60, deadline=None)
@given(
    masks=st.lists(
        st.one_of(st.none(), st.lists(st.booleans(), min_size=1, max_size=12)), min_size=1, max_size=5
    )
)
def test_a_filtered_view_maps_kept_positions_to_shard_rows(masks: list) -> None:
    """FilteredView.rows (one vectorised search) equals each shard's own map, shards mixed in any order."""
    import numpy as np

    from fastload.train.filtering import FilteredView

    spans = {i: selection.spans(selection.from_mask(m)) for i, m in enumerate(masks) if m is not None}
    counts = np.array([selection.count(spans[i]) if i in spans else 5 for i in range(len(masks))])
    view = FilteredView(counts, spans)
    refs = [(i, p) for i in range(len(masks)) for p in range(int(counts[i]))][::-1]
    shards = np.array([s for s, _ in refs], dtype=np.int64)
    positions = np.array([p for _, p in refs], dtype=np.int64)
    want = [int(selection.rows_at(spans[s], [p])[0]) if s in spans else p for s, p in refs]
    assert view.rows(shards, positions).tolist() == want
