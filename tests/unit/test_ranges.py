"""Byte-range plans cover an object exactly once; every ranged GET response is checked against the ask."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fastload.core.ranges import (
    ByteRange,
    PartLayout,
    Verdict,
    check_response,
    parse_content_range,
    plan_ranges,
)

SETTINGS = settings(max_examples=300, deadline=None)
MiB = 1 << 20


# --- ByteRange ---------------------------------------------------------------------------------------


def test_byte_range_header_is_inclusive() -> None:
    assert ByteRange(0, 100).header() == "bytes=0-99"
    assert ByteRange(5, 6).header() == "bytes=5-5"  # one byte
    assert ByteRange(8 * MiB, 16 * MiB).header() == "bytes=8388608-16777215"
    assert ByteRange(0, 100).length == 100
    assert ByteRange(5, 6).length == 1
    assert str(ByteRange(10, 20)) == "bytes 10-19"


@pytest.mark.parametrize(("start", "end"), [(0, 0), (5, 5), (6, 5), (-1, 3), (-5, -1)])
def test_byte_range_rejects_empty_or_negative(start: int, end: int) -> None:
    with pytest.raises(ValueError):
        ByteRange(start, end)


# --- plan_ranges -------------------------------------------------------------------------------------


def test_plan_ranges_examples() -> None:
    assert plan_ranges(10, 4) == [ByteRange(0, 4), ByteRange(4, 8), ByteRange(8, 10)]
    assert plan_ranges(8, 4) == [ByteRange(0, 4), ByteRange(4, 8)]
    assert plan_ranges(3, 4) == [ByteRange(0, 3)]
    assert plan_ranges(10, 4, start=3) == [ByteRange(3, 7), ByteRange(7, 10)]
    assert plan_ranges(0, 4) == []
    assert plan_ranges(10, 4, start=10) == []
    assert plan_ranges(1, 1) == [ByteRange(0, 1)]


@pytest.mark.parametrize(
    ("size", "part_size", "start"),
    [(10, 0, 0), (10, -1, 0), (10, 4, -1), (10, 4, 11), (-1, 4, 0)],
)
def test_plan_ranges_rejects_bad_input(size: int, part_size: int, start: int) -> None:
    with pytest.raises(ValueError):
        plan_ranges(size, part_size, start=start)


@SETTINGS
@given(size=st.integers(0, 5_000), part_size=st.integers(1, 1_500), data=st.data())
def test_plan_ranges_cover_every_byte_once_in_order(size: int, part_size: int, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, size), label="start")
    ranges = plan_ranges(size, part_size, start=start)
    # Listing every byte offset the plan touches gives [start, size) exactly: no gap, no overlap, in order.
    assert [i for r in ranges for i in range(r.start, r.end)] == list(range(start, size))
    assert all(r.length <= part_size for r in ranges)
    assert all(r.length == part_size for r in ranges[:-1])
    assert len(ranges) == math.ceil((size - start) / part_size)


@SETTINGS
@given(
    size=st.integers(0, 1 << 44),
    part_size=st.integers(1, 1 << 44),
    start_frac=st.floats(0, 1),
)
def test_plan_ranges_cover_large_objects(size: int, part_size: int, start_frac: float) -> None:
    start = min(size, int(size * start_frac))
    # Keep the plan short enough to walk; the small-size test above covers dense plans.
    assume((size - start) // part_size <= 2_000)
    ranges = plan_ranges(size, part_size, start=start)
    if start == size:
        assert ranges == []
        return
    assert ranges[0].start == start
    assert ranges[-1].end == size
    for a, b in itertools.pairwise(ranges):
        assert a.end == b.start
        assert a.length == part_size
    assert 0 < ranges[-1].length <= part_size
    assert sum(r.length for r in ranges) == size - start


# --- PartLayout (the reader's parts) -------------------------------------------------------------------


def test_part_layout_examples() -> None:
    layout = PartLayout(part_bytes=8, first_bytes=3)
    assert [layout.index_of(o) for o in (0, 2, 3, 10, 11, 19)] == [0, 0, 1, 1, 2, 3]
    assert [layout.start_of(i) for i in range(4)] == [0, 3, 11, 19]
    assert layout.range_of(0) == ByteRange(0, 3)
    assert layout.range_of(2) == ByteRange(11, 19)
    assert layout.range_of(2, 15) == ByteRange(11, 15)  # clipped to the object
    assert [layout.last_index(n) for n in (0, 1, 3, 4, 11, 12, 19, 20)] == [-1, 0, 0, 1, 1, 2, 2, 3]
    plain = PartLayout(part_bytes=4, first_bytes=4)  # no small first part: parts of a plan starting at 0
    assert [plain.range_of(i, 10) for i in range(plain.last_index(10) + 1)] == plan_ranges(10, 4)


@pytest.mark.parametrize(("part_bytes", "first_bytes"), [(0, 0), (4, 0), (4, 5), (-1, 1)])
def test_part_layout_rejects_bad_sizes(part_bytes: int, first_bytes: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        PartLayout(part_bytes, first_bytes)


@SETTINGS
@given(size=st.integers(0, 5_000), part_bytes=st.integers(1, 1_500), data=st.data())
def test_part_layout_covers_every_byte_once_in_order(size: int, part_bytes: int, data: st.DataObject) -> None:
    layout = PartLayout(part_bytes, data.draw(st.integers(1, part_bytes), label="first_bytes"))
    parts = [layout.range_of(i, size) for i in range(layout.last_index(size) + 1)]
    assert [o for r in parts for o in range(r.start, r.end)] == list(range(size))
    for i, r in enumerate(parts):
        assert r.start == layout.start_of(i)
        assert {layout.index_of(o) for o in (r.start, r.end - 1)} == {i}
        assert r.length <= (layout.first_bytes if i == 0 else part_bytes)
        if r.end < size:  # every part but the last is whole
            assert r == layout.range_of(i)


# --- parse_content_range -----------------------------------------------------------------------------


def test_parse_content_range_examples() -> None:
    assert parse_content_range("bytes 0-99/100") == (0, 100, 100)
    assert parse_content_range("bytes 5-5/6") == (5, 6, 6)
    assert parse_content_range("bytes 100-199/*") == (100, 200, None)
    assert parse_content_range("bytes 8388608-16777215/1000000000") == (8 * MiB, 16 * MiB, 10**9)


@pytest.mark.parametrize(
    "junk",
    [
        "",
        "bytes",
        "bytes 0-99",
        "bytes 0-99/",
        "bytes=0-99/100",
        "bytes */100",
        "bytes 0-/100",
        "bytes -99/100",
        "bytes -1-5/10",
        "bytes 0-99/-1",
        "bytes 0-99/100 0-99/100",
        "items 0-99/100",
        "bytes a-b/c",
        "bytes 0x0-0x63/100",
        "0-99/100",
        "bytes 0 - 99 / 100",
    ],
)
def test_parse_content_range_rejects_junk(junk: str) -> None:
    with pytest.raises(ValueError):
        parse_content_range(junk)


@pytest.mark.parametrize("value", ["bytes 5-4/10", "bytes 100-0/200", "bytes 1-0/*"])
def test_parse_content_range_rejects_end_before_start(value: str) -> None:
    with pytest.raises(ValueError):
        parse_content_range(value)


@SETTINGS
@given(
    a=st.integers(0, 1 << 50), n=st.integers(1, 1 << 40), extra=st.integers(0, 1 << 40), star=st.booleans()
)
def test_parse_content_range_round_trip(a: int, n: int, extra: int, star: bool) -> None:
    b = a + n - 1  # inclusive end of n bytes
    total = None if star else b + 1 + extra
    value = f"bytes {a}-{b}/{'*' if total is None else total}"
    assert parse_content_range(value) == (a, a + n, total)


@SETTINGS
@given(a=st.integers(1, 1 << 50), back=st.integers(1, 1 << 50))
def test_parse_content_range_rejects_any_reversed_range(a: int, back: int) -> None:
    b = max(0, a - back)
    with pytest.raises(ValueError):
        parse_content_range(f"bytes {a}-{b}/{a + 10}")


# --- check_response ----------------------------------------------------------------------------------


@st.composite
def asked_ranges(draw: st.DrawFn) -> tuple[int, ByteRange]:
    """An object size and a range of it that starts inside the object (it may run past the end)."""
    size = draw(st.one_of(st.integers(1, 300), st.integers(1, 1 << 42)), label="object size")
    start = draw(st.integers(0, size - 1), label="asked start")
    length = draw(st.one_of(st.integers(1, 300), st.integers(1, 1 << 42)), label="asked length")
    return size, ByteRange(start, start + length)


def correct_206(size: int, asked: ByteRange) -> tuple[str, int, int, int]:
    """What a correct server sends: the asked range clipped to the object (Content-Range, Content-Length)."""
    first = asked.start
    last = min(asked.end, size) - 1  # inclusive
    return f"bytes {first}-{last}/{size}", last - first + 1, first, last


@SETTINGS
@given(case=asked_ranges(), known=st.booleans())
def test_correct_206_is_partial(case: tuple[int, ByteRange], known: bool) -> None:
    size, asked = case
    content_range, content_length, _, _ = correct_206(size, asked)
    check = check_response(206, content_range, content_length, asked, size if known else None)
    assert check.verdict is Verdict.PARTIAL, check.reason
    assert check.total == size


def test_first_request_past_the_end_is_clipped_by_the_server() -> None:
    asked = ByteRange(0, 8 * MiB)
    check = check_response(206, "bytes 0-99/100", 100, asked, None)
    assert check.verdict is Verdict.PARTIAL, check.reason
    assert check.total == 100
    # Once the size is known the same answer still fits.
    assert check_response(206, "bytes 0-99/100", 100, asked, 100).verdict is Verdict.PARTIAL
    # A server that claims to send the unclipped range of a 100-byte object is wrong.
    bad = check_response(206, f"bytes 0-{8 * MiB - 1}/100", 8 * MiB, asked, None)
    assert bad.verdict is Verdict.BAD and bad.reason


MUTATIONS = ["start", "end", "total", "star", "length", "no_range", "garbled", "status_200", "status"]


@SETTINGS
@given(case=asked_ranges(), known=st.booleans(), mutation=st.sampled_from(MUTATIONS), data=st.data())
def test_any_single_mutation_of_a_correct_206_is_bad(
    case: tuple[int, ByteRange], known: bool, mutation: str, data: st.DataObject
) -> None:
    size, asked = case
    good_range, content_length, first, last = correct_206(size, asked)
    content_range: str | None = good_range
    total: int | str = size
    status = 206
    object_size = size if known else None
    # Wrong ranges are sent self-consistently (Content-Length matching the wrong range) or not, so that the
    # range check itself must catch them.
    consistent = data.draw(st.booleans(), label="length follows the wrong range")

    if mutation == "start":
        new_first = data.draw(st.integers(0, last).filter(lambda v: v != first), label="start")
        first = new_first
    elif mutation == "end":
        new_last = data.draw(st.integers(first, last + 1000).filter(lambda v: v != last), label="end")
        last = new_last
    elif mutation == "total":
        if known:
            total = data.draw(st.integers(1, size + 1000).filter(lambda v: v != size), label="total")
        else:
            # Without a known size a wrong total shows only where it contradicts the bytes sent: an object
            # smaller than the range sent, or (when the server had to clip) a total other than the clip point.
            smaller = st.integers(1, last)  # total <= last: the range runs past the claimed end
            choices = [smaller] if last >= 1 else []
            if asked.end > size:
                choices.append(st.integers(size + 1, size + 1000))
            assume(choices)
            total = data.draw(st.one_of(choices), label="total")
    elif mutation == "star":
        total = "*"
    elif mutation == "length":
        content_length = data.draw(
            st.integers(0, content_length + 1000).filter(lambda v: v != content_length), label="length"
        )
    elif mutation == "no_range":
        content_range = None
    elif mutation == "garbled":
        content_range = data.draw(
            st.sampled_from([f"bytes={first}-{last}/{size}", f"{first}-{last}/{size}", "bytes", ""])
        )
    elif mutation == "status_200":
        if not known:
            # A 200 of any length is a whole object while the size is unknown; nothing to contradict.
            assume(False)
        status = 200
        content_length = data.draw(
            st.integers(0, size + 1000).filter(lambda v: v != size), label="200 body length"
        )
    elif mutation == "status":
        status = data.draw(
            st.sampled_from([204, 301, 304, 400, 403, 404, 412, 416, 500, 503])
            | st.integers(100, 599).filter(lambda s: s not in (200, 206)),
            label="status",
        )

    if mutation in ("start", "end", "total", "star"):
        content_range = f"bytes {first}-{last}/{total}"
        if consistent and mutation in ("start", "end"):
            content_length = last - first + 1

    check = check_response(status, content_range, content_length, asked, object_size)
    assert check.verdict is Verdict.BAD, (status, content_range, content_length, asked, object_size)
    assert check.reason


OTHER_STATUSES = [
    100,
    201,
    202,
    203,
    204,
    205,
    207,
    226,
    301,
    302,
    304,
    307,
    400,
    403,
    404,
    412,
    416,
    500,
    503,
]


@pytest.mark.parametrize("status", OTHER_STATUSES)
@pytest.mark.parametrize("object_size", [None, 100])
def test_other_statuses_are_bad_even_with_perfect_headers(status: int, object_size: int | None) -> None:
    # Headers that would pass on a 206 (and a length that would pass on a 200): only the status is wrong.
    check = check_response(status, "bytes 0-99/100", 100, ByteRange(0, 100), object_size)
    assert check.verdict is Verdict.BAD
    assert str(status) in check.reason


def test_mutation_examples() -> None:
    asked = ByteRange(100, 200)
    ok = ("bytes 100-199/1000", 100)
    assert check_response(206, *ok, asked, 1000).verdict is Verdict.PARTIAL
    for status, content_range, length in [
        (206, "bytes 101-200/1000", 100),  # shifted by one
        (206, "bytes 99-198/1000", 100),
        (206, "bytes 100-198/1000", 99),  # one byte short
        (206, "bytes 100-200/1000", 101),  # one byte long
        (206, "bytes 100-199/1001", 100),  # other object
        (206, "bytes 100-199/*", 100),
        (206, "bytes 100-199/1000", 99),  # body length disagrees with the range
        (206, None, 100),
        (200, None, 999),
        (200, None, None),
        (416, "bytes */1000", 0),
        (304, None, 0),
        (500, None, 100),
    ]:
        check = check_response(status, content_range, length, asked, 1000)
        assert check.verdict is Verdict.BAD, (status, content_range, length)
        assert check.reason


@SETTINGS
@given(case=asked_ranges(), known=st.booleans())
def test_200_with_the_whole_object_is_whole(case: tuple[int, ByteRange], known: bool) -> None:
    size, asked = case
    check = check_response(200, None, size, asked, size if known else None)
    assert check.verdict is Verdict.WHOLE, check.reason
    assert check.total == size


def test_200_without_length_is_bad() -> None:
    for object_size in (None, 100):
        check = check_response(200, None, None, ByteRange(0, 10), object_size)
        assert check.verdict is Verdict.BAD and check.reason
