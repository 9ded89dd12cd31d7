"""A read-only, seekable file of a known size whose bytes come from byte ranges (fetched ahead, or one
ranged read each): what pyarrow reads a Parquet shard through when only some of its bytes travel. The
subclasses decide where a range comes from (:meth:`RangedFile._bytes_at`); this class keeps the position,
the bounds, and the check that a range came whole."""

from __future__ import annotations

import io
from typing import Any


class RangedFile(io.RawIOBase):
    """``size`` bytes named ``name`` (for messages); reads past the end return what is left, then nothing."""

    def __init__(self, size: int, name: str = "") -> None:
        super().__init__()
        self._size, self._pos, self.name_ = size, 0, name

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}.get(whence)
        if base is None:
            raise ValueError(f"invalid whence {whence!r}")
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        if n == 0:
            return 0
        data = self._bytes_at(self._pos, n)
        if len(data) != n:
            where = f"{self.name_}: " if self.name_ else ""
            raise OSError(f"{where}short read: {len(data)} of {n} bytes at offset {self._pos}")
        view[:n] = data
        self._pos += n
        return n

    def _bytes_at(self, offset: int, n: int) -> bytes | memoryview:
        """The ``n`` bytes at ``offset`` (within the file)."""
        raise NotImplementedError
