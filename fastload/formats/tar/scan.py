"""Walking a tar archive's members: the one parser of member headers (every dialect) that reading, indexing
and verifying all go through, over a sequential stream (data skipped by reading, so a checksum wrapper
around the stream still sees every byte) or over bytes in memory (a run of samples).

Dialects: v7 (no magic), ustar (name prefix), pax (``x`` and Solaris ``X`` records ``path``, ``size``,
``linkpath``; ``g`` global headers that set none of those), GNU and oldgnu (``L`` long names, ``K`` long
link names, base-256 numbers). Directories and GNU volume labels are skipped; what a sample cannot be
(links, devices, FIFOs, sparse files, multi-volume parts, unknown types) is refused with a message that
says what to do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from fastload.formats.tar.header import (
    BLOCK,
    Member,
    TarFormatError,
    UnsupportedMember,
    padded,
    parse_header,
)
from fastload.formats.tar.header import parse_pax as parse_pax

# an extended header (pax, GNU long name) bigger than this is refused, not read into memory
MAX_META_BYTES = 1 << 20
REGULAR = frozenset((b"0", b"\0", b"7"))
_SKIPPED = frozenset((b"5", b"V"))  # directories, GNU volume labels
_REPACK = "repack the files with `fastload pack`"
_REFUSED = {
    b"1": ("a hard link", f"create the tar with GNU tar --hard-dereference, or {_REPACK}"),
    b"2": ("a symbolic link", f"create the tar with GNU tar --dereference (-h), or {_REPACK}"),
    b"3": ("a character device", _REPACK),
    b"4": ("a block device", _REPACK),
    b"6": ("a FIFO", _REPACK),
    b"S": ("a GNU sparse file", f"create the tar without --sparse (-S), or {_REPACK}"),
    b"M": ("part of a multi-volume archive", f"join the volumes into one tar, or {_REPACK}"),
}
_PAX_KEYS = ("path", "size", "linkpath")


class Cursor(Protocol):
    """What :func:`iter_members` reads through: a position, reads and skips (short at the end)."""

    pos: int

    def read(self, n: int) -> bytes: ...

    def skip(self, n: int) -> int: ...


class BufferCursor:
    """A :class:`Cursor` over bytes in memory that start at archive offset ``base``."""

    def __init__(self, data: bytes | memoryview, base: int = 0) -> None:
        self.data, self.base, self.pos = data, base, base

    def read(self, n: int) -> bytes:
        at = self.pos - self.base
        out = bytes(self.data[at : at + n])
        self.pos += len(out)
        return out

    def skip(self, n: int) -> int:
        got = max(0, min(n, len(self.data) - (self.pos - self.base)))
        self.pos += got
        return got


def _refusal(name: bytes, offset: int, typeflag: bytes) -> UnsupportedMember:
    what, fix = _REFUSED.get(typeflag, (f"of type {typeflag!r}, which tar readers do not agree on", _REPACK))
    shown = name.decode("utf-8", "surrogateescape")
    return UnsupportedMember(
        f"member {shown!r} at byte {offset} is {what}, not a regular file, so it cannot be a sample's "
        f"member: {fix}"
    )


def _meta(r: Cursor, size: int, offset: int) -> bytes:
    """The data of an extended header (pax records, a GNU long name) of ``size`` bytes."""
    if size > MAX_META_BYTES:
        raise TarFormatError(
            f"extended header at byte {offset} says it holds {size} bytes (more than {MAX_META_BYTES}): "
            "a damaged header"
        )
    data = r.read(size)
    if len(data) < size or r.skip(padded(size) - size) < padded(size) - size:
        raise TarFormatError(f"extended header at byte {offset} is truncated")
    return data


def _pax_size(value: bytes, offset: int) -> int:
    if not value.isdigit():
        raise TarFormatError(f"pax header at byte {offset}: size {value!r} is not a decimal number")
    return int(value)


def iter_members(r: Cursor, *, end_required: bool = True) -> Iterator[Member]:
    """Regular-file members in order, each after its data has been skipped; stops at an end-of-archive
    block, or (``end_required=False``, a run of samples in memory) where the bytes end at a member
    boundary.

    Raises :class:`TarFormatError` (with the byte offset in the message) on a truncated or corrupt archive
    and on members a sample cannot be (see the module's docstring).
    """
    path: bytes | None = None
    size_of: int | None = None
    meta_offset: int | None = None
    while True:
        header_offset = r.pos
        block = r.read(BLOCK)
        if not block and not end_required and meta_offset is None:
            return
        if not block:
            raise TarFormatError(
                f"archive ends at byte {header_offset} without end-of-archive blocks (truncated?)"
            )
        try:
            header = parse_header(block)
        except TarFormatError as exc:
            raise TarFormatError(f"bad header at byte {header_offset}: {exc}") from None
        if header is None:
            if meta_offset is not None:
                raise TarFormatError(f"extended header at byte {meta_offset} is not followed by a member")
            return
        typeflag = header.typeflag
        if typeflag == b"X":  # Solaris' pax extended header, read as POSIX 'x' (as tarfile does)
            typeflag = b"x"
        if typeflag in (b"x", b"g", b"L", b"K"):
            data = _meta(r, header.size, header_offset)
            if typeflag == b"g":
                pax = parse_pax(data)
                if any(k in pax for k in _PAX_KEYS) or any(k.startswith("GNU.sparse") for k in pax):
                    raise UnsupportedMember(
                        f"global pax header at byte {header_offset} sets {sorted(pax)} for every later "
                        f"member, which fastload does not support: {_REPACK}"
                    )
                continue
            if meta_offset is None:
                meta_offset = header_offset
            if typeflag == b"x":
                pax = parse_pax(data)
                if any(k.startswith("GNU.sparse") for k in pax):
                    raise _refusal(pax.get("path", header.name), header_offset, b"S")
                path = pax.get("path", path)
                if "size" in pax:
                    size_of = _pax_size(pax["size"], header_offset)
            elif typeflag == b"L":
                path = data.split(b"\0", 1)[0]
            continue
        start = header_offset if meta_offset is None else meta_offset
        name = header.name if path is None else path
        size = header.size if size_of is None else size_of
        path = size_of = meta_offset = None
        if typeflag in _SKIPPED:
            if typeflag == b"5" and size:
                raise UnsupportedMember(
                    f"directory {name!r} at byte {start} says it holds {size} data bytes: {_REPACK}"
                )
            if r.skip(padded(size)) < padded(size):
                raise TarFormatError(f"member {name!r} at byte {start} is truncated")
            continue
        if typeflag not in REGULAR:
            raise _refusal(name, start, typeflag)
        data_offset = r.pos
        skipped = r.skip(padded(size))
        if skipped < padded(size):
            raise TarFormatError(
                f"member {name.decode('utf-8', 'surrogateescape')!r} at byte {start} is truncated: "
                f"{skipped} of {padded(size)} data bytes present"
            )
        plain = start == header_offset and typeflag != b"7"
        yield Member(
            name.decode("utf-8", "surrogateescape"),
            typeflag.decode("latin-1"),
            start,
            data_offset,
            size,
            plain,
        )
