"""Reading tar members' headers from a sequential stream (data skipped by reading, so a checksum
wrapper around the stream still sees every byte)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from crc32c import crc32c

from fastload.formats.tar.header import BLOCK, Member, TarFormatError, padded, parse_block, parse_pax


class ChecksumReader:
    """Wraps a binary stream; tracks position and CRC32C of everything read through it."""

    def __init__(self, f: BinaryIO, chunk_bytes: int = 4 << 20) -> None:
        self.f = f
        self.crc = 0
        self.pos = 0
        self._buf = bytearray(chunk_bytes)
        self._view = memoryview(self._buf)

    def read(self, n: int) -> bytes:
        data = self.f.read(n)
        self.crc = crc32c(data, self.crc)
        self.pos += len(data)
        return data

    def skip(self, n: int) -> int:
        """Read and discard up to ``n`` bytes; return how many were there."""
        left = n
        while left:
            got = self.f.readinto(self._view[: min(left, len(self._buf))])  # type: ignore[attr-defined]
            if not got:
                break
            self.crc = crc32c(self._view[:got], self.crc)
            self.pos += got
            left -= got
        return n - left

    def drain(self) -> None:
        while self.skip(len(self._buf)):
            pass


def iter_members(r: ChecksumReader) -> Iterator[Member]:
    """Regular-file (and other non-meta) members in order; stops at the end-of-archive blocks.

    Raises :class:`TarFormatError` (with the byte offset in the message) on a truncated or corrupt archive.
    """
    pending_path: bytes | None = None
    pending_size: int | None = None
    meta_offset: int | None = None
    while True:
        header_offset = r.pos
        block = r.read(BLOCK)
        if not block:
            raise TarFormatError(
                f"archive ends at byte {header_offset} without end-of-archive blocks (truncated?)"
            )
        try:
            parsed = parse_block(block)
        except TarFormatError as exc:
            raise TarFormatError(f"bad header at byte {header_offset}: {exc}") from None
        if parsed is None:
            return
        name, size, typeflag = parsed
        if typeflag in (b"x", b"g", b"L"):
            data = r.read(size)
            if len(data) < size:
                raise TarFormatError(f"extended header at byte {header_offset} is truncated")
            r.skip(padded(size) - size)
            if meta_offset is None:
                meta_offset = header_offset
            if typeflag == b"x":
                pax = parse_pax(data)
                pending_path = pax.get("path", pending_path)
                if "size" in pax:
                    pending_size = int(pax["size"])
            elif typeflag == b"L":
                pending_path = data.rstrip(b"\0")
            continue
        if pending_path is not None:
            name = pending_path
        if pending_size is not None:
            size = pending_size
        start = header_offset if meta_offset is None else meta_offset
        data_offset = r.pos
        yield Member(
            name.decode("utf-8", "surrogateescape"), typeflag.decode("latin-1"), start, data_offset, size
        )
        skipped = r.skip(padded(size)) if typeflag in (b"0", b"\0", b"7") else 0
        if typeflag in (b"0", b"\0", b"7") and skipped < padded(size):
            raise TarFormatError(
                f"member {name!r} at byte {start} is truncated: "
                f"{skipped} of {padded(size)} data bytes present"
            )
        pending_path = pending_size = meta_offset = None
