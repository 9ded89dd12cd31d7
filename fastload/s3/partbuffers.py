"""Reusable part buffers for the ranged reader (this process's pool is in :mod:`fastload.s3.runtime`).

A fresh buffer costs a page fault per 4 KiB the first time it is written (measured: ~7 ms per 8 MiB on a
small VM, about ten times the copy out of it), so the buffers of parts the reader has finished with are
kept, up to a byte cap, and handed to the next parts (of any reader in the process). New buffers are
anonymous ``mmap`` pages: the kernel zeroes them as the socket read first writes them, without the GIL.
"""

from __future__ import annotations

import mmap
import threading

Buffer = bytearray | mmap.mmap
_MMAP_MIN_BYTES = 1 << 20


def new_buffer(n: int) -> Buffer:
    """Writable memory for ``n`` bytes, not taken from a pool."""
    return mmap.mmap(-1, n) if n >= _MMAP_MIN_BYTES else bytearray(n)


class BufferPool:
    """Idle buffers by size, at most ``cap_bytes`` of them in all (set by the largest cap given)."""

    def __init__(self) -> None:
        self._free: dict[int, list[Buffer]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def idle_bytes(self) -> int:
        return self._bytes

    def take(self, n: int) -> Buffer:
        """A buffer of exactly ``n`` bytes (its old contents are overwritten by the caller)."""
        with self._lock:
            free = self._free.get(n)
            if free:
                self._bytes -= n
                return free.pop()
        return new_buffer(n)

    def give(self, buf: Buffer, cap_bytes: int) -> None:
        """Keep ``buf`` for reuse if the pool stays within ``cap_bytes``; nothing may still write to it."""
        n = len(buf)
        if n < _MMAP_MIN_BYTES:
            return  # small buffers are cheap to make
        with self._lock:
            if self._bytes + n <= cap_bytes:
                self._free.setdefault(n, []).append(buf)
                self._bytes += n

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._bytes = 0
