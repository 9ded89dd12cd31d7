"""``fastload.s3.partfetch`` over a transport of another store: the part fetch sees only the
``s3.objectio`` seam (a GET with Range and If-Match answered by status, headers and a body), so a store adds
a transport, not a reader. An in-memory transport here cuts its first body short; the fetch resumes after
the last good byte with If-Match and hands over the right bytes."""

from __future__ import annotations

import random
import threading

import pytest

from fastload.config import S3Config
from fastload.core.ranges import ByteRange
from fastload.s3 import runtime
from fastload.s3.objectio import Abort, Body, ObjectState
from fastload.s3.partfetch import Fetcher, PastEnd
from fastload.s3.races import RaceGroup
from fastload.s3.retrying import BadResponse, Retrier
from fastload.s3.transport import error_failure

DATA = bytes(range(256)) * 40  # 10,240 bytes


class Answer:
    """A 206 for ``[start, end)`` of DATA whose body ends after ``cut`` bytes (None: whole)."""

    def __init__(self, start: int, end: int, cut: int | None) -> None:
        self.status, self.etag = 206, '"v1"'
        self.content_range = f"bytes {start}-{end - 1}/{len(DATA)}"
        self.content_length = end - start
        self._data = DATA[start : end if cut is None else start + cut]

    def readinto(self, view: memoryview) -> int:
        n = min(len(view), len(self._data), 1000)
        view[:n], self._data = self._data[:n], self._data[n:]
        return n

    def close(self) -> None:
        pass


class MemoryStore:
    """An ObjectIO of another store: ranged GETs of DATA, the first body cut after 3,000 bytes."""

    abortable = False

    def __init__(self) -> None:
        self.asked: list[dict[str, str]] = []

    def get(self, headers: dict[str, str], *, abort: Abort | None = None, fresh: bool = False) -> Body:
        self.asked.append(dict(headers))
        start, _, last = headers["Range"].removeprefix("bytes=").partition("-")
        if int(start) >= len(DATA):
            raise BadResponse(error_failure(416, b"<Code>InvalidRange</Code>"))
        end = min(int(last) + 1, len(DATA))
        return Answer(int(start), end, 3000 if len(self.asked) == 1 else None)

    def head(self, headers: dict[str, str]) -> Body:
        return Answer(0, len(DATA), 0)


def fetcher(store: MemoryStore) -> Fetcher:
    config = S3Config()
    return Fetcher(
        store,
        ObjectState("b", "k", None),
        config,
        runtime.current(),
        Retrier.from_config(config, rng=random.Random(0), sleep=lambda s: None),
        group=RaceGroup(),
        closing=threading.Event(),
        part=8192,
        first=1024,
        clock=lambda: 0.0,
    )


def test_a_cut_body_is_resumed_after_its_last_good_byte_with_if_match() -> None:
    store = MemoryStore()
    part = fetcher(store).fetch(ByteRange(1000, 9000), first=True)
    assert bytes(part.view(0, len(part))) == DATA[1000:9000]
    assert store.asked == [{"Range": "bytes=1000-8999"}, {"Range": "bytes=4000-8999", "If-Match": '"v1"'}]


def test_a_first_request_past_the_end_says_so() -> None:
    with pytest.raises(PastEnd):
        fetcher(MemoryStore()).fetch(ByteRange(len(DATA), len(DATA) + 10), first=True)
