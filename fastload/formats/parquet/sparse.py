"""A Parquet shard as pyarrow sees it during a projected read: a file of the shard's size of which only the
fetched byte ranges (the column chunks asked for, :mod:`fastload.core.projection`) are held. pyarrow,
given the footer separately (``ParquetFile(..., metadata=...)``), reads exactly those column chunks, each
with one positioned read; a read outside them (a footer that understates a chunk's length, as some old
writers' do) is fetched through the shard's ranged ``read`` and counted in :attr:`SparseFile.misses`."""

from __future__ import annotations

import bisect
import io
from collections.abc import Callable, Sequence
from typing import Any


class SparseFile(io.RawIOBase):
    """Read-only, seekable; ``pieces`` are ``(offset, bytes)`` of the fetched ranges, sorted, disjoint."""

    def __init__(
        self, size: int, pieces: Sequence[tuple[int, bytes]], read: Callable[[int, int], bytes]
    ) -> None:
        super().__init__()
        self._size, self._pieces, self._read = size, list(pieces), read
        self._starts = [p[0] for p in self._pieces]
        self._pos = 0
        self.misses = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = min(len(view), self._size - self._pos)
        if n <= 0:
            return 0
        i = bisect.bisect_right(self._starts, self._pos) - 1
        if i >= 0:
            start, data = self._pieces[i]
            if self._pos + n <= start + len(data):
                at = self._pos - start
                view[:n] = data[at : at + n]
                self._pos += n
                return n
        self.misses += 1
        view[:n] = self._read(self._pos, n)
        self._pos += n
        return n
