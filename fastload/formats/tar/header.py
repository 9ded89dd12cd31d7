"""POSIX (pax) tar member headers, built and parsed as bytes.

Headers are deterministic: mode 0644, uid/gid 0, empty user/group names, mtime fixed (0 by default).
A name that is not ASCII or longer than 100 bytes, or a size of 8 GiB or more, gets a pax extended header
(``././@PaxHeader``, as Python's tarfile and star write it) before the member's ustar header; GNU tar,
bsdtar, Python's tarfile and WebDataset all read that. Sizes of whole members are computable in advance
(:func:`member_size`), so shard plans are exact.
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCK = 512
END_OF_ARCHIVE = bytes(2 * BLOCK)
_MAX_OCTAL_SIZE = 8**11 - 1
_PAX_NAME = b"././@PaxHeader"


class TarFormatError(ValueError):
    """Bytes that are not a valid tar header."""


def padded(n: int) -> int:
    """``n`` rounded up to a whole number of 512-byte blocks."""
    return (n + BLOCK - 1) // BLOCK * BLOCK


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _ustar(name: bytes, size: int, typeflag: bytes, mtime: int) -> bytes:
    head = bytearray(BLOCK)
    head[0 : len(name)] = name
    head[100:108] = _octal(0o644, 8)
    head[108:116] = _octal(0, 8)
    head[116:124] = _octal(0, 8)
    head[124:136] = _octal(size, 12)
    head[136:148] = _octal(mtime, 12)
    head[148:156] = b"        "
    head[156:157] = typeflag
    head[257:263] = b"ustar\0"
    head[263:265] = b"00"
    head[329:337] = _octal(0, 8)
    head[337:345] = _octal(0, 8)
    head[148:156] = b"%06o\0 " % sum(head)
    return bytes(head)


def _pax_record(keyword: bytes, value: bytes) -> bytes:
    body = b" " + keyword + b"=" + value + b"\n"
    length = len(body)
    while len(body) + len(str(length)) != length:
        length = len(body) + len(str(length))
    return str(length).encode() + body


def member_header(name: str, size: int, *, mtime: int = 0) -> bytes:
    """Header block(s) for a regular file member ``name`` of ``size`` bytes (data follows, padded)."""
    if size < 0:
        raise ValueError(f"{size=} must be >= 0")
    if not 0 <= mtime <= _MAX_OCTAL_SIZE:
        raise ValueError(f"{mtime=} must fit 11 octal digits")
    raw = name.encode("utf-8")
    records = b""
    if len(raw) > 100 or not raw.isascii():
        records += _pax_record(b"path", raw)
    if size > _MAX_OCTAL_SIZE:
        records += _pax_record(b"size", str(size).encode())
    if not records:
        return _ustar(raw, size, b"0", mtime)
    fallback = name.encode("ascii", "replace")[:100]
    pax = _ustar(_PAX_NAME, len(records), b"x", mtime) + records + bytes(padded(len(records)) - len(records))
    return pax + _ustar(fallback, min(size, _MAX_OCTAL_SIZE), b"0", mtime)


def header_size(name: str, size: int) -> int:
    """Bytes :func:`member_header` returns for this name and size, without building it."""
    raw_len = len(name.encode("utf-8"))
    records = 0
    if raw_len > 100 or not name.isascii():
        records += len(_pax_record(b"path", b"x" * raw_len))
    if size > _MAX_OCTAL_SIZE:
        records += len(_pax_record(b"size", str(size).encode()))
    return BLOCK if not records else 2 * BLOCK + padded(records)


def member_size(name: str, size: int) -> int:
    """Total bytes a member takes in the archive: header(s) plus data padded to a block."""
    return header_size(name, size) + padded(size)


@dataclass(frozen=True)
class Member:
    """A parsed member: its name, type flag, data offset in the archive and data size."""

    name: str
    typeflag: str
    header_offset: int
    data_offset: int
    size: int

    @property
    def end(self) -> int:
        """Offset just past this member's padded data."""
        return self.data_offset + padded(self.size)


def _parse_octal(field: bytes, what: str) -> int:
    text = field.rstrip(b"\0 ").lstrip(b" ")
    if field[:1] and field[0] & 0x80:
        return int.from_bytes(field[1:], "big")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise TarFormatError(f"{what} field is not an octal number: {field!r}") from None


def parse_block(block: bytes) -> tuple[bytes, int, bytes] | None:
    """``(name, size, typeflag)`` of one header block; None for an all-zero (end) block."""
    if len(block) != BLOCK:
        raise TarFormatError(f"header block is {len(block)} bytes, expected {BLOCK} (truncated archive)")
    if not any(block):
        return None
    stored = _parse_octal(block[148:156], "checksum")
    actual = sum(block[:148]) + 8 * 32 + sum(block[156:])
    if stored != actual:
        raise TarFormatError(f"header checksum {stored} does not match computed {actual}")
    name = block[:100].split(b"\0", 1)[0]
    if block[257:262] == b"ustar" and block[345:500].strip(b"\0"):
        name = block[345:500].split(b"\0", 1)[0] + b"/" + name
    return name, _parse_octal(block[124:136], "size"), block[156:157]


def is_header_of(buf: bytes, pos: int, name: bytes, size: int) -> bool:
    """Whether ``buf[pos:pos + 512]`` is the plain ustar header of a regular file ``name`` of ``size``
    bytes, as :func:`member_header` writes it (octal size, no pax header).

    The check readers make against an index that records each member's name and size: a few byte
    comparisons instead of parsing the header. The checksum is not recomputed: the fields it protects
    (name, size, type) are compared with the index directly, and data bytes have no checksum in tar.
    """
    return (
        pos + BLOCK <= len(buf)
        and buf.startswith(name, pos)
        and (len(name) == 100 or buf[pos + len(name)] == 0)
        and buf[pos + 124 : pos + 136] == b"%011o\0" % size
        and buf[pos + 156] in _REGULAR
    )


_REGULAR = frozenset(b"0\0")


def parse_pax(records: bytes) -> dict[str, bytes]:
    """Keyword/value pairs of a pax extended header's data."""
    out: dict[str, bytes] = {}
    pos = 0
    while pos < len(records):
        space = records.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(records[pos:space])
        except ValueError:
            raise TarFormatError(f"bad pax record length at {pos}") from None
        if length <= 0:
            break
        record = records[space + 1 : pos + length - 1]
        keyword, _, value = record.partition(b"=")
        out[keyword.decode("utf-8", "replace")] = value
        pos += length
    return out
