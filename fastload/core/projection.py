"""Which bytes to fetch for a projected read of a columnar shard: the byte ranges of the column chunks a
read needs, merged where they lie close together (one request then costs less than two, and the bytes
between them are fewer than a request is worth), so a read of one small column of a wide table fetches
about that column's bytes, in few requests. Pure: the ranges come from the Parquet footer
(:mod:`fastload.formats.parquet.footer`), the reads are the caller's."""

from __future__ import annotations

from collections.abc import Iterable

# Two ranges closer than this are fetched as one: at ~100 MB/s per connection, 64 KiB is ~0.6 ms of
# transfer, less than one request's round trip to S3 (pyarrow coalesces at 8 KiB for its pre-buffering,
# for local disks as much as object stores).
GAP_BYTES = 64 << 10


def coalesce(ranges: Iterable[tuple[int, int]], *, gap_bytes: int = GAP_BYTES) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges sorted and merged: overlapping or touching ones, and ones separated by at
    most ``gap_bytes``. Every input range lies inside exactly one output range; outputs are disjoint and
    more than ``gap_bytes`` apart."""
    if gap_bytes < 0:
        raise ValueError(f"{gap_bytes=} must be >= 0")
    out: list[tuple[int, int]] = []
    for start, stop in sorted(r for r in ranges if r[1] > r[0]):
        if start < 0:
            raise ValueError(f"range [{start}, {stop}) starts before 0")
        if out and start - out[-1][1] <= gap_bytes:
            if stop > out[-1][1]:
                out[-1] = (out[-1][0], stop)
        else:
            out.append((start, stop))
    return out


def fetched_bytes(ranges: Iterable[tuple[int, int]]) -> int:
    """The bytes a list of ranges fetches."""
    return sum(stop - start for start, stop in ranges)
