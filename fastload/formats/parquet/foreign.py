"""Indexes of Parquet files written by other tools (pyarrow/pandas, Hugging Face ``datasets``, Spark, DuckDB,
hive folders ``year=2024/month=01/...``), built from their footers: one ranged read of each file's tail, in
parallel, gives its row groups ``(first byte, bytes, rows)``, rows and schema. Each row is a sample.

- ``__key__``: a column's value (``key_column``; a ``__key__`` column is used when there is one), else
  ``<file name without .parquet>/<row:06d>``. Only a key column costs more reads: its column chunks.
- ``partition``: the file's hive folders, ``"k1=v1/k2=v2"`` (segments holding ``=``, as written), else None.
- Files under a folder (or named) starting with ``_`` or ``.`` are left out, as Spark and pyarrow do
  (``_SUCCESS``, ``_temporary/``, ``_metadata``).
- Every file must have the same columns with the same types (nullability aside): the first two that
  differ are named in a :class:`ConfigError` with the fields that differ.
- The whole file is not read, so its CRC32C is not known: the entry's ``checksum`` is ``""`` (the shard
  cache then checks sizes only; ``fastload verify`` checks pages, row groups and keys).
- ``footer``: the footer bytes read to index the file, kept in its entry (and in its sample table by
  ``fastload index``), so readers do not read the file's tail again.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO, cast, overload

import pyarrow as pa

from fastload.config import S3Config
from fastload.core.index import DatasetIndex, ShardEntry
from fastload.errors import ConfigError, FastloadError, VerifyError
from fastload.formats.parquet.footer import row_groups_of
from fastload.formats.parquet.payload import ParquetShard
from fastload.formats.parquet.values import KEY_COLUMN, column_values
from fastload.storage import access as storage
from fastload.storage.rangedfile import RangedFile

TAIL_BYTES = 64 << 10  # the first read of a footer (pyarrow also reads 64 KiB first)
GAP_BYTES = 64 << 10  # key column chunks closer than this are fetched with one read
SUFFIX = ".parquet"


class RowKeys(Sequence[str]):
    """The derived keys ``<stem>/<row:06d>`` of a file's rows, made when asked (no list per row)."""

    __slots__ = ("rows", "stem")

    def __init__(self, stem: str, rows: int) -> None:
        self.stem, self.rows = stem, rows

    def __len__(self) -> int:
        return self.rows

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.rows))]
        j = i + self.rows if i < 0 else i
        if not 0 <= j < self.rows:
            raise IndexError(f"key {i} of {self.rows}")
        return f"{self.stem}/{j:06d}"

    def __iter__(self) -> Iterator[str]:
        return (f"{self.stem}/{j:06d}" for j in range(self.rows))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RowKeys):
            return (self.stem, self.rows) == (other.stem, other.rows)
        if isinstance(other, (list, tuple, Sequence)) and not isinstance(other, str):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # unhashable, like the list it stands for

    def __repr__(self) -> str:
        return f"RowKeys({self.stem!r}, {self.rows})"


def ignored(name: str) -> bool:
    """Whether a file (``/``-separated name under the dataset's root) is left out of a foreign dataset."""
    return any(part.startswith(("_", ".")) for part in name.split("/"))


def partition_of(name: str) -> str | None:
    """The hive partition of a file's name: its folders holding ``=``, joined by ``/``, or None."""
    parts = [p for p in name.split("/")[:-1] if "=" in p]
    return "/".join(parts) or None


def stem_of(name: str) -> str:
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name


class SparseFile(RangedFile):
    """A read-only file of ``size`` bytes served from byte ranges fetched before (``add``), fetching any
    other range it is asked for with ``fetch(offset, size)``: what pyarrow reads a footer and chosen column
    chunks through, so only those bytes travel."""

    def __init__(self, size: int, fetch: Callable[[int, int], bytes]) -> None:
        super().__init__(size)
        self._fetch = fetch
        self._pieces: list[tuple[int, bytes]] = []

    def add(self, offset: int, data: bytes) -> None:
        self._pieces.append((offset, data))

    def holds(self, offset: int, size: int) -> bool:
        return any(o <= offset and offset + size <= o + len(d) for o, d in self._pieces)

    def prefetch(self, ranges: Sequence[tuple[int, int]], *, gap_bytes: int = GAP_BYTES) -> None:
        """Fetch the ``(offset, size)`` ranges not held yet now (up to 8 at once), for reads to come:
        ranges closer than ``gap_bytes`` are fetched as one."""
        merged: list[list[int]] = []
        for offset, size in sorted(r for r in ranges if not self.holds(*r)):
            if merged and offset - merged[-1][1] <= gap_bytes:
                merged[-1][1] = max(merged[-1][1], offset + size)
            else:
                merged.append([offset, offset + size])
        if len(merged) <= 1:
            for start, stop in merged:
                self.add(start, self._fetch(start, stop - start))
            return
        with ThreadPoolExecutor(max_workers=min(8, len(merged))) as pool:  # (the store's gate bounds them)
            for (start, _), data in zip(
                merged, pool.map(lambda r: self._fetch(r[0], r[1] - r[0]), merged), strict=True
            ):
                self.add(start, data)

    def _bytes_at(self, offset: int, n: int) -> bytes | memoryview:
        for start, data in self._pieces:
            if start <= offset and offset + n <= start + len(data):
                return memoryview(data)[offset - start : offset - start + n]
        data = self._fetch(offset, n)
        if len(data) == n:
            self.add(offset, data)
        return data


@dataclass
class Footer:
    """What one file's footer says (``meta``: pyarrow's ``FileMetaData``) and how to read more of it."""

    url: str
    name: str
    size: int
    meta: Any
    schema: pa.Schema
    file: SparseFile
    raw: bytes  # the footer (Thrift FileMetaData, without its length and magic): its ParquetShard's

    def row_groups(self) -> list[tuple[int, int, int]]:
        """Each row group's ``(first byte, bytes, rows)`` (:func:`.footer.row_groups_of`)."""
        return row_groups_of(self.meta)

    def column_ranges(self, column: str) -> list[tuple[int, int]]:
        """The ``(offset, size)`` of ``column``'s chunk in each row group."""
        out = []
        for g in range(self.meta.num_row_groups):
            rg = self.meta.row_group(g)
            for c in range(rg.num_columns):
                col = rg.column(c)
                if col.path_in_schema.split(".")[0] == column:
                    first = col.data_page_offset
                    if col.has_dictionary_page and col.dictionary_page_offset is not None:
                        first = min(first, col.dictionary_page_offset)
                    out.append((first, col.total_compressed_size))
        return out


def _fetcher(url: str, s3_config: S3Config | None) -> tuple[Callable[[int, int], bytes], Callable[[], None]]:
    """``(fetch(offset, size), close)`` for ranged reads of ``url``: ``pread`` locally, the parallel ranged
    reader's ``fetch_range`` on S3 (retried, checked, If-Match after the first answer)."""
    f = storage.open_read(url, config=s3_config)
    if not storage.is_remote(url):
        fd = f.fileno()
        return (lambda offset, size: os.pread(fd, size, offset)), f.close
    fetch_range = f.fetch_range  # type: ignore[attr-defined]
    return (lambda offset, size: fetch_range(offset, offset + size)), f.close


def read_footer(url: str, name: str, size: int | None, fetch: Callable[[int, int], bytes]) -> Footer:
    """Parse a file's footer from its tail: one read of the last 64 KiB (a second for a bigger footer).
    Raises :class:`VerifyError` naming the file for anything that is not a Parquet footer."""
    import pyarrow.parquet as pq

    if size is None:
        raise ConfigError(f"{url}: size unknown")
    if size < 12:
        raise VerifyError(f"not a Parquet file ({size} bytes)", shard=name)
    first = min(size, TAIL_BYTES)
    tail = fetch(size - first, first)
    if len(tail) != first or tail[-4:] != b"PAR1":
        raise VerifyError(
            "not a Parquet file (no PAR1 at its end): an unfinished or damaged write? re-export it",
            shard=name,
            offset=size - 4,
        )
    footer = int.from_bytes(tail[-8:-4], "little") + 8
    if footer + 4 > size:
        raise VerifyError(f"footer of {footer} bytes in a {size}-byte file", shard=name, offset=size - 8)
    if footer > first:
        tail = fetch(size - footer, footer - first) + tail
    file = SparseFile(size, fetch)
    file.add(size - len(tail), tail)
    try:
        meta = pq.read_metadata(pa.BufferReader(tail[-footer:]))
        schema = meta.schema.to_arrow_schema()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise VerifyError(
            f"not a readable Parquet footer ({exc})", shard=name, offset=size - footer
        ) from None
    return Footer(url, name, size, meta, schema, file, tail[len(tail) - footer : len(tail) - 8])


def _column_keys(footer: Footer, column: str) -> list[str]:
    """The ``column``'s values of every row as keys (only its column chunks are fetched)."""
    from fastload.formats.parquet.arrowfile import open_parquet

    if footer.schema.get_field_index(column) < 0:
        names = ", ".join(footer.schema.names)
        raise ConfigError(
            f"{footer.url}: no column {column!r} to take keys from (key_column=); it has {names}"
        )
    footer.file.prefetch(footer.column_ranges(column))
    parquet = open_parquet(cast(BinaryIO, footer.file))
    values = column_values(parquet.read(columns=[column], use_threads=False).column(0))
    for row, value in enumerate(values):
        if value is None:
            raise VerifyError(
                f"row {row} has no {column!r} (null), which names samples (key_column=); pick a column "
                "without nulls, or leave key_column out for keys <file>/<row>",
                shard=footer.name,
            )
    return [v if isinstance(v, str) else str(v) for v in values]


def _entry(footer: Footer, key_column: str | None) -> ShardEntry:
    row_groups = footer.row_groups()
    rows = sum(rg[2] for rg in row_groups)
    column = (
        key_column if key_column is not None else (KEY_COLUMN if KEY_COLUMN in footer.schema.names else None)
    )
    keys: Sequence[str] = (
        _column_keys(footer, column) if column is not None and rows else RowKeys(stem_of(footer.name), rows)
    )
    return ShardEntry(
        name=footer.name,
        bytes=footer.size,
        checksum="",
        keys=keys,
        row_groups=row_groups,
        partition=partition_of(footer.name),
        format="parquet",
        payload=ParquetShard(footer.raw) if footer.raw else None,
    )


def _scan_one(
    url: str, name: str, size: int | None, key_column: str | None, s3_config: S3Config | None
) -> tuple[Footer | None, ShardEntry | None, VerifyError | None]:
    try:
        fetch, close = _fetcher(url, s3_config)
    except (OSError, FastloadError) as exc:
        return None, None, VerifyError(f"cannot read the file ({exc})", shard=name)
    try:
        if size is None:
            size = storage.size_of(url, config=s3_config)
        footer = read_footer(url, name, size, fetch)
        return footer, _entry(footer, key_column), None
    except VerifyError as exc:
        return None, None, exc
    finally:
        close()


def schema_difference(a: pa.Schema, b: pa.Schema) -> list[str]:
    """The fields two files' schemas differ in (name: type here vs there; nullability aside)."""
    ta = {f.name: f.type for f in a}
    tb = {f.name: f.type for f in b}
    out = []
    for n in sorted(set(ta) | set(tb)):
        x, y = ta.get(n), tb.get(n)
        if x != y:
            out.append(f"{n}: {x if x is not None else '(absent)'} vs {y if y is not None else '(absent)'}")
    return out


def _sizes(named: Sequence[tuple[str, str]], s3_config: S3Config | None) -> dict[str, int]:
    """Sizes of the files from one listing of their common prefix on S3 (a LIST per 1,000 objects instead
    of a HEAD per file: the footer read then needs one GET); local files: ``stat``."""
    if not named:
        return {}
    url, name = named[0]
    if not storage.is_remote(url):
        return {u: os.path.getsize(u) for u, _ in named if os.path.isfile(u)}
    from fastload.storage.listing import FileEntry
    from fastload.storage.s3source import S3Source

    root = url[: len(url) - len(name)].rstrip("/")
    wanted = {u for u, _ in named}
    listed = S3Source(root, config=s3_config or S3Config.from_env()).list()
    return {e.path: e.size for e in listed if isinstance(e, FileEntry) and e.path in wanted}


def scan_parquet_files(
    named: Sequence[tuple[str, str]],
    *,
    threads: int,
    s3_config: S3Config | None,
    key_column: str | None = None,
) -> tuple[DatasetIndex, list[VerifyError]]:
    """The index of foreign Parquet files ``(url, name)`` from their footers (``threads`` at a time) and
    the files that could not be read. Files under ``_``/``.`` folders are left out (:func:`ignored`)."""
    named = [(u, n) for u, n in named if not ignored(n)]
    if not named:
        raise ConfigError("no Parquet files to index (files under folders named _* or .* are left out)")
    sizes = _sizes(named, s3_config)
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(named)))) as pool:
        found = list(pool.map(lambda x: _scan_one(x[0], x[1], sizes.get(x[0]), key_column, s3_config), named))
    problems = [p for _, _, p in found if p is not None]
    footers = [f for f, _, _ in found if f is not None]
    entries = [e for _, e, _ in found if e is not None]
    for footer in footers[1:]:
        diff = schema_difference(footers[0].schema, footer.schema)
        if diff:
            raise ConfigError(
                f"{footers[0].url} and {footer.url} have different columns ({'; '.join(diff[:8])}): one "
                "dataset needs one schema; index (or read) the files of each schema apart"
            )
    _check_unique(entries, key_column)
    fields = sorted(n for n in footers[0].schema.names if n != KEY_COLUMN) if footers else []
    options: dict[str, Any] = {"shard_format": "parquet", "indexed_by": "fastload index", "read": "footers"}
    if key_column is not None:
        options["key_column"] = key_column
    index = DatasetIndex(shard_format="parquet", fields=fields, shards=entries, options=options)
    return index, problems


def _check_unique(entries: Sequence[ShardEntry], key_column: str | None) -> None:
    """Keys from a column must name one sample each (derived keys always do)."""
    seen: dict[str, str] = {}
    for e in entries:
        if isinstance(e.keys, RowKeys):
            continue
        for k in e.keys:
            if k in seen:
                raise ConfigError(
                    f"key {k!r} names two samples ({seen[k]} and {e.name}), from column "
                    f"{key_column or KEY_COLUMN!r}; give key_column= a column whose values are unique, or "
                    "leave it out for keys <file>/<row>"
                )
            seen[k] = e.name
