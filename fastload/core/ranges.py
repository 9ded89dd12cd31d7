"""Byte-range planning (how the ranged reader cuts an object into parts) and the range contract every
ranged GET response must meet.

Ranges are half-open ``[start, end)`` here; HTTP's ``bytes=a-b`` is inclusive, so ``b = end - 1``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True, order=True)
class ByteRange:
    """Bytes ``[start, end)`` of an object."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"invalid byte range [{self.start}, {self.end})")

    @property
    def length(self) -> int:
        return self.end - self.start

    def header(self) -> str:
        """The ``Range`` header value: ``bytes=start-(end-1)``."""
        return f"bytes={self.start}-{self.end - 1}"

    def __str__(self) -> str:
        return f"bytes {self.start}-{self.end - 1}"


def plan_ranges(end: int, part_size: int, *, start: int = 0) -> list[ByteRange]:
    """Cut ``[start, end)`` into consecutive ranges of ``part_size`` bytes (the last may be shorter)."""
    if part_size <= 0:
        raise ValueError(f"{part_size=} must be > 0")
    if not 0 <= start <= end:
        raise ValueError(f"{start=} must be within [0, {end=}]")
    return [ByteRange(a, min(a + part_size, end)) for a in range(start, end, part_size)]


@dataclass(frozen=True)
class PartLayout:
    """How the ranged reader cuts an object into numbered parts: part 0 is ``[0, first_bytes)`` (small, so
    that its answer brings the object's size and ETag quickly), then parts of ``part_bytes``."""

    part_bytes: int
    first_bytes: int

    def __post_init__(self) -> None:
        part_bytes, first_bytes = self.part_bytes, self.first_bytes
        if part_bytes <= 0:
            raise ValueError(f"{part_bytes=} must be > 0")
        if not 0 < first_bytes <= part_bytes:
            raise ValueError(f"{first_bytes=} must be within [1, {part_bytes=}]")

    def index_of(self, offset: int) -> int:
        """The part holding byte ``offset``."""
        return 0 if offset < self.first_bytes else 1 + (offset - self.first_bytes) // self.part_bytes

    def start_of(self, index: int) -> int:
        """The first byte of part ``index``."""
        return 0 if index == 0 else self.first_bytes + (index - 1) * self.part_bytes

    def range_of(self, index: int, size: int | None = None) -> ByteRange:
        """The bytes of part ``index``, clipped to an object of ``size`` bytes when given (the part must
        then hold at least one of its bytes)."""
        start = self.start_of(index)
        end = self.first_bytes if index == 0 else start + self.part_bytes
        return ByteRange(start, end if size is None else min(end, size))

    def last_index(self, size: int) -> int:
        """The last part of an object of ``size`` bytes (-1 when it is empty)."""
        return self.index_of(size - 1) if size > 0 else -1


_CONTENT_RANGE = re.compile(r"^\s*bytes\s+([0-9]+)-([0-9]+)/([0-9]+|\*)\s*$")


def parse_content_range(value: str) -> tuple[int, int, int | None]:
    """``(start, end_exclusive, total)`` from ``Content-Range: bytes a-b/total`` (total None for ``*``)."""
    match = _CONTENT_RANGE.match(value)
    if not match:
        raise ValueError(f"unparseable Content-Range {value!r}")
    a, b = int(match.group(1)), int(match.group(2))
    if b < a:
        raise ValueError(f"Content-Range {value!r} ends before it starts")
    total = None if match.group(3) == "*" else int(match.group(3))
    return a, b + 1, total


class Verdict(Enum):
    """What to do with a response to a ranged GET."""

    PARTIAL = "partial"  # a 206 for exactly the asked range: use the body
    WHOLE = "whole"  # a 200 carrying exactly the whole object: use it, no second download
    BAD = "bad"  # anything else: not these bytes (retryable; the server or a proxy misbehaved)


@dataclass(frozen=True)
class RangeCheck:
    verdict: Verdict
    reason: str = ""
    total: int | None = None


def check_response(
    status: int,
    content_range: str | None,
    content_length: int | None,
    asked: ByteRange,
    object_size: int | None,
) -> RangeCheck:
    """Check a ranged GET's status and headers against what was asked (before reading the body).

    ``object_size`` is None while unknown (the first request). The body must then still be exactly
    ``content_length`` bytes long; the reader checks that as it reads.
    """
    if status == 206:
        if content_range is None:
            return RangeCheck(Verdict.BAD, "206 without a Content-Range header")
        try:
            start, end, total = parse_content_range(content_range)
        except ValueError as exc:
            return RangeCheck(Verdict.BAD, str(exc))
        expected_end = asked.end if object_size is None else min(asked.end, object_size)
        if total is None:
            return RangeCheck(Verdict.BAD, f"Content-Range {content_range!r} does not give the object size")
        if object_size is not None and total != object_size:
            return RangeCheck(Verdict.BAD, f"Content-Range total {total} != object size {object_size}")
        if object_size is None:
            expected_end = min(asked.end, total)
        if start != asked.start or end != expected_end:
            return RangeCheck(
                Verdict.BAD,
                f"asked for bytes {asked.start}-{expected_end - 1}, got Content-Range {content_range!r}",
            )
        if content_length is not None and content_length != end - start:
            return RangeCheck(Verdict.BAD, f"Content-Length {content_length} != range length {end - start}")
        return RangeCheck(Verdict.PARTIAL, total=total)
    if status == 200:
        if content_length is None:
            return RangeCheck(Verdict.BAD, "200 to a Range request without Content-Length")
        if object_size is not None and content_length != object_size:
            return RangeCheck(
                Verdict.BAD, f"200 to a Range request with {content_length} bytes, object has {object_size}"
            )
        return RangeCheck(Verdict.WHOLE, total=content_length)
    return RangeCheck(Verdict.BAD, f"unexpected HTTP status {status} to a ranged GET")
