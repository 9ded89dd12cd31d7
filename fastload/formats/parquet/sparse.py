"""A Parquet shard as pyarrow sees it during a projected read: a file of the shard's size of which only the
fetched byte ranges (the column chunks asked for, :mod:`fastload.core.projection`) are held. pyarrow,
given the footer separately (``ParquetFile(..., metadata=...)``), reads exactly those column chunks, each
with one positioned read; a read outside them (a footer that understates a chunk's length, as some old
writers' do) is fetched through the shard's ranged ``read`` and counted in :attr:`SparseFile.misses`."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

from fastload.storage.rangedfile import RangedFile


class SparseFile(RangedFile):
    """Read-only, seekable; ``pieces`` are ``(offset, bytes)`` of the fetched ranges, sorted, disjoint."""

    def __init__(
        self, size: int, pieces: Sequence[tuple[int, bytes]], read: Callable[[int, int], bytes]
    ) -> None:
        super().__init__(size)
        self._pieces, self._read = list(pieces), read
        self._starts = [p[0] for p in self._pieces]
        self.misses = 0

    def _bytes_at(self, offset: int, n: int) -> bytes | memoryview:
        i = bisect.bisect_right(self._starts, offset) - 1
        if i >= 0:
            start, data = self._pieces[i]
            if offset + n <= start + len(data):
                return memoryview(data)[offset - start : offset - start + n]
        self.misses += 1
        return self._read(offset, n)
