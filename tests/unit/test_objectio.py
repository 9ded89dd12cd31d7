"""``fastload.s3.objectio``: the one body loop (:func:`fill`) every GET of the reader, its hedges and the
HTTP/1.1 error-body read go through, and the object's known size and ETag."""

from __future__ import annotations

import time

import pytest

from fastload.errors import ObjectChangedError
from fastload.s3.objectio import ObjectState, fill


class Pieces:
    """A body that answers ``readinto`` with the given pieces, then raises ``fail`` (or ends)."""

    def __init__(self, pieces: list[bytes], fail: Exception | None = None) -> None:
        self.pieces, self.fail = list(pieces), fail

    def readinto(self, view: memoryview) -> int:
        if not self.pieces:
            if self.fail is not None:
                raise self.fail
            return 0
        piece = self.pieces.pop(0)[: len(view)]
        view[: len(piece)] = piece
        return len(piece)


def test_fill_reads_until_the_view_is_full_or_the_body_ends() -> None:
    buf = bytearray(6)
    assert fill(Pieces([b"ab", b"cd", b"efgh"]), memoryview(buf))[0] == 6
    assert buf == bytearray(b"abcdef")
    short = bytearray(6)
    assert fill(Pieces([b"xy"]), memoryview(short))[0] == 2


def test_fill_reports_each_piece_so_bytes_before_a_failure_are_counted() -> None:
    seen: list[int] = []
    with pytest.raises(TimeoutError):
        fill(Pieces([b"ab", b"c"], TimeoutError()), memoryview(bytearray(8)), time.monotonic(),
             lambda n, now: seen.append(n))  # fmt: skip
    assert seen == [2, 1]


def test_the_object_state_refuses_an_answer_of_another_version() -> None:
    state = ObjectState("b", "k", None)
    state.learn(10, '"e1"')
    assert state.headers() == {"If-Match": '"e1"'}
    with pytest.raises(ObjectChangedError, match="s3://b/k changed"):
        state.learn(10, '"e2"')
    with pytest.raises(ObjectChangedError, match="changed size"):
        state.learn(11, '"e1"')
    assert ObjectState("b", "k", "v1").headers() == {}  # a pinned version needs no If-Match
