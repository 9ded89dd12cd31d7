"""A Parquet shard's footer (its Thrift ``FileMetaData``: schema, row groups, each column chunk's byte range
and statistics) as bytes and as pyarrow metadata, and the column-chunk ranges a projected read fetches.

``fastload pack`` records the footer in the shard's sample table (``footer`` column,
``docs/INDEX-FORMAT.md``), so the reader has it with the table it fetches anyway; for a table without one
(packed before, or a foreign shard) it is read with one ranged read of the shard's tail (a second when the
footer is larger than :data:`TAIL_BYTES`). Parsed footers are kept in a small per-process cache, keyed by
what identifies the file's content (:func:`cache_key`), so planning and reading in one process parse a
shard's footer once.
"""

from __future__ import annotations

import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import crc32c

from fastload.errors import IndexFormatError

MAGIC = b"PAR1"
TAIL_BYTES = 64 << 10  # the first read of a footer not recorded in the table (pyarrow reads as much)
_CACHED = 256  # parsed footers kept per process
_cache: OrderedDict[tuple[str, int, str, int], Any] = OrderedDict()
_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) gets a new lock: another thread of the parent may have held
    this one at the fork, and nothing in the child would ever release it."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def footer_of(tail: bytes, *, where: str) -> bytes | int:
    """The footer at the end of ``tail`` (the last bytes of a Parquet file), or how many tail bytes it takes
    when ``tail`` is too short. Raises :class:`IndexFormatError` naming ``where`` if ``tail`` does not end
    like a Parquet file."""
    if len(tail) < 8 or tail[-4:] != MAGIC:
        raise IndexFormatError(f"{where}: does not end with Parquet's magic bytes; not a Parquet file?")
    length = int(struct.unpack_from("<I", tail, len(tail) - 8)[0])
    if len(tail) < length + 8:
        return length + 8
    return tail[len(tail) - 8 - length : len(tail) - 8]


def read_footer(read: Callable[[int, int], bytes], size: int, *, where: str) -> bytes:
    """The footer of a ``size``-byte Parquet file, by ``read(offset, size)``: one read of its tail, two when
    the footer is longer than :data:`TAIL_BYTES`."""
    if size < 12:
        raise IndexFormatError(f"{where}: {size} bytes is too short for a Parquet file")
    want = min(size, TAIL_BYTES)
    got = footer_of(read(size - want, want), where=where)
    if isinstance(got, int):
        if got > size - 4:
            raise IndexFormatError(f"{where}: its footer claims {got} bytes of a {size}-byte file")
        got = footer_of(read(size - got, got), where=where)
    assert isinstance(got, bytes)
    return got


def tail_footer(path: str) -> bytes:
    """The footer of a local Parquet file (what the writer records in the shard's table)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size

        def read(offset: int, n: int) -> bytes:
            f.seek(offset)
            return f.read(n)

        return read_footer(read, size, where=path)


def parse_footer(footer: bytes, *, where: str) -> Any:
    """``pyarrow.parquet.FileMetaData`` of footer bytes (:func:`footer_of`)."""
    import pyarrow as pa

    from fastload.formats.parquet.arrowfile import open_parquet

    framed = MAGIC + footer + struct.pack("<I", len(footer)) + MAGIC
    try:
        return open_parquet(pa.BufferReader(framed)).metadata
    except Exception as exc:  # pyarrow raises several types for a bad footer
        raise IndexFormatError(f"{where}: its Parquet footer does not parse ({exc}); re-pack it") from None


def cache_key(name: str, size: int, checksum: str, footer: bytes) -> tuple[str, int, str, int] | None:
    """The cache key of a shard's parsed footer: its name, size, CRC32C and its footer's CRC32C. None (not
    cached across reads) when neither is known: a foreign file indexed without its footer, whose name and
    size may be another dataset's file's (``checksum`` ``""``)."""
    if not checksum and not footer:
        return None
    return name, size, checksum, crc32c.crc32c(footer) if footer else -1


def metadata(
    key: tuple[str, int, str, int] | None,
    size: int,
    footer: bytes | None,
    read: Callable[[int, int], bytes],
    *,
    where: str,
) -> Any:
    """The parsed footer of the ``size``-byte shard ``key`` (:func:`cache_key`): from the cache, else from
    ``footer`` (recorded in its table), else read from the shard's tail."""
    if key is not None:
        with _lock:
            meta = _cache.get(key)
            if meta is not None:
                _cache.move_to_end(key)
                return meta
    meta = parse_footer(footer or read_footer(read, size, where=where), where=where)
    if key is None:
        return meta
    with _lock:
        _cache[key] = meta
        while len(_cache) > _CACHED:
            _cache.popitem(last=False)
    return meta


def column_chunks(meta: Any, group: int, columns: Sequence[str] | None) -> list[tuple[int, int]]:
    """``[start, stop)`` of each column chunk of row group ``group`` whose top-level column is in
    ``columns`` (None: all), as pyarrow reads them (from the dictionary page when there is one)."""
    rg = meta.row_group(group)
    wanted = None if columns is None else set(columns)
    out = []
    for c in range(rg.num_columns):
        col = rg.column(c)
        if wanted is not None and col.path_in_schema.split(".", 1)[0] not in wanted:
            continue
        start = col.data_page_offset
        if col.has_dictionary_page and col.dictionary_page_offset is not None:
            start = min(start, col.dictionary_page_offset) if col.dictionary_page_offset > 0 else start
        out.append((start, start + col.total_compressed_size))
    return out


def row_groups_of(meta: Any) -> list[tuple[int, int, int]]:
    """Each row group's ``(first byte, bytes, rows)`` (what a shard's table records): its column chunks from
    the first page (a dictionary page included) over their compressed sizes."""
    out = []
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        starts, total = [], 0
        for c in range(rg.num_columns):
            col = rg.column(c)
            first = col.data_page_offset
            if col.has_dictionary_page and col.dictionary_page_offset is not None:
                first = min(first, col.dictionary_page_offset)
            starts.append(first)
            total += col.total_compressed_size
        out.append((min(starts) if starts else 4, total, rg.num_rows))
    return out
