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


class UnsupportedMember(TarFormatError):
    """A well-formed member that cannot be a sample's member (a link, device, FIFO, sparse file...)."""


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


_PLAIN: dict[int, tuple[bytes, bytes, bytes, int]] = {}  # mtime -> an empty member's fixed fields, their sum


def _plain(raw: bytes, size: int, mtime: int) -> bytes:
    """:func:`_ustar` of a regular file (``raw``: at most 100 bytes), from the fixed fields of an empty one
    (per ``mtime``) and a checksum summed over the two fields that change: the same bytes at a sixth of the
    cost (writers build one per member)."""
    fixed = _PLAIN.get(mtime)
    if fixed is None:
        empty = _ustar(b"", 0, b"0", mtime)
        base = sum(empty[:148]) + sum(b"        ") + sum(empty[156:]) - sum(empty[124:136])
        fixed = _PLAIN.setdefault(mtime, (empty[100:124], empty[136:148], empty[156:], base))
    mode_to_gid, stamp, tail, base = fixed
    size_field = b"%011o\0" % size
    check = b"%06o\0 " % (base + sum(raw) + sum(size_field))
    return raw + bytes(100 - len(raw)) + mode_to_gid + size_field + stamp + check + tail


def member_header(name: str, size: int, *, mtime: int = 0) -> bytes:
    """Header block(s) for a regular file member ``name`` of ``size`` bytes (data follows, padded)."""
    if size < 0:
        raise ValueError(f"{size=} must be >= 0")
    if not 0 <= mtime <= _MAX_OCTAL_SIZE:
        raise ValueError(f"{mtime=} must fit 11 octal digits")
    raw = name.encode("utf-8")
    if len(raw) <= 100 and size <= _MAX_OCTAL_SIZE and raw.isascii():
        return _plain(raw, size, mtime)
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
    plain: bool = False  # a regular file ('0' or NUL) with one 512-byte header (no pax or GNU header before)

    @property
    def end(self) -> int:
        """Offset just past this member's padded data."""
        return self.data_offset + padded(self.size)


def parse_number(field: bytes, what: str) -> int:
    """A numeric header field: octal digits (NUL- or space-terminated, as every dialect writes them), or
    GNU/star base-256 (first byte 0x80, then a big-endian number: sizes of 8 GiB and more)."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    if field and field[0] & 0x80:
        raise TarFormatError(f"{what} field is a negative or unknown base-256 number: {field!r}")
    text = field.split(b"\0", 1)[0].strip(b" ")
    if text.strip(b"01234567"):
        raise TarFormatError(f"{what} field is not an octal number: {field!r}")
    return int(text, 8) if text else 0


@dataclass(frozen=True)
class Header:
    """One header block, parsed: name (with the ustar prefix), data size, type flag and link name."""

    name: bytes
    size: int
    typeflag: bytes
    linkname: bytes


_POSIX_MAGIC = b"ustar\x0000"


def parse_header(block: bytes) -> Header | None:
    """The fields of one header block of any dialect (v7, ustar, pax, GNU, oldgnu); None for an all-zero
    (end-of-archive) block. Raises :class:`TarFormatError` for a short block, a checksum that matches
    neither the unsigned nor the signed sum (as tarfile accepts), or a number field that is not one.

    The name's ustar prefix (bytes 345-500) is used only with the POSIX magic ``ustar\\0`` + ``00``: GNU
    headers keep access and change times there. A v7 regular file (type NUL) whose name ends with ``/`` is
    a directory (type ``5``), as tarfile and GNU tar read it."""
    if len(block) != BLOCK:
        raise TarFormatError(f"header block is {len(block)} bytes, expected {BLOCK} (truncated archive)")
    if not any(block):
        return None
    stored = parse_number(block[148:156], "checksum")
    unsigned = sum(block) - sum(block[148:156]) + 256
    if stored != unsigned:
        high = sum(1 for b in block[:148] if b > 127) + sum(1 for b in block[156:] if b > 127)
        signed = unsigned - 256 * high
        if stored != signed:
            raise TarFormatError(f"header checksum {stored} does not match computed {unsigned}")
    name = block[:100].split(b"\0", 1)[0]
    if block[257:265] == _POSIX_MAGIC and block[345] != 0:
        name = block[345:500].split(b"\0", 1)[0] + b"/" + name
    typeflag = block[156:157]
    if typeflag == b"\0" and name.endswith(b"/"):
        typeflag = b"5"
    return Header(name, parse_number(block[124:136], "size"), typeflag, block[157:257].split(b"\0", 1)[0])


def parse_block(block: bytes) -> tuple[bytes, int, bytes] | None:
    """``(name, size, typeflag)`` of one header block; None for an all-zero (end) block."""
    header = parse_header(block)
    return None if header is None else (header.name, header.size, header.typeflag)


def is_header_of(buf: bytes, pos: int, name: bytes, size: int) -> bool:
    """Whether ``buf[pos:pos + 512]`` is the plain ustar header of a regular file ``name`` of ``size``
    bytes, as :func:`member_header` writes it (octal size, type ``0``, no name prefix, no pax header).

    The check readers make against an index that records each member's name and size: a few byte
    comparisons instead of parsing the header (the C reader makes the same ones). Every field a reader
    uses (name, prefix, size, type) must say what the index says, so the bytes taken are those the parser
    would take; the checksum, which protects only those fields here, is not recomputed (that would cost
    more than the rest of the read of a small sample): a header whose other bytes changed still reads.
    """
    return (
        pos + BLOCK <= len(buf)
        and buf.startswith(name, pos, pos + 100)  # (False for a name over 100 bytes)
        and (len(name) == 100 or buf[pos + len(name)] == 0)
        and buf[pos + 124 : pos + 136] == b"%011o\0" % size
        and buf[pos + 156] == 0x30  # '0' (a v7 NUL type with a name ending in '/' is a directory)
        and buf[pos + 345] == 0  # no ustar prefix
    )


def parse_pax(records: bytes) -> dict[str, bytes]:
    """Keyword/value pairs of a pax extended header's data (``"LEN KEY=VALUE\\n"`` records, LEN counting
    the whole record); trailing NUL padding is allowed. Raises :class:`TarFormatError` for a record that is
    not one (a bad length, no ``=``, no newline at its end)."""
    out: dict[str, bytes] = {}
    pos = 0
    n = len(records)
    while pos < n and records[pos] != 0:
        space = records.find(b" ", pos, pos + 20)
        digits = records[pos:space] if space > pos else b""
        if not digits.isdigit():
            raise TarFormatError(f"bad pax record length at byte {pos} of the extended header")
        end = pos + int(digits)
        if end <= space + 1 or end > n or records[end - 1] != 0x0A:
            raise TarFormatError(f"pax record at byte {pos} of the extended header is cut or too long")
        keyword, eq, value = records[space + 1 : end - 1].partition(b"=")
        if not eq or not keyword:
            raise TarFormatError(f"pax record at byte {pos} of the extended header has no keyword=value")
        out[keyword.decode("utf-8", "replace")] = value
        pos = end
    return out
