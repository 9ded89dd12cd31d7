"""Writing one Parquet shard: one row per sample, ``__key__`` plus one binary column per field.

Each row group's column data is read from the input files straight into Arrow buffers (no per-sample
``bytes`` objects), so a sample's bytes are held once, and memory stays within one row group. Every page
carries its CRC32 (Parquet's page checksum), so readers and ``fastload verify`` can check each page's bytes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from fastload.core.index import ShardEntry
from fastload.core.keys import Sample
from fastload.core.plan import plan_row_groups
from fastload.errors import Skip, write_error
from fastload.formats.parquet.footer import row_groups_of, tail_footer
from fastload.formats.parquet.payload import ParquetShard
from fastload.formats.parquet.stats import STATS_MAX_VALUE_BYTES, shard_stats
from fastload.formats.shard import DEFAULT_BUFFER_BYTES, ShardResult, crc32c
from fastload.storage.inputs import (
    CHANGED_WHILE_READ,
    READ_ATTEMPTS,
    Input,
    Opened,
    changed_while_read,
    close_all,
    open_ahead,
    open_sample,
    read_exactly,
    read_problem,
)

KEY_COLUMN = "__key__"
_MAX_COLUMN_BYTES = (1 << 31) - 1


def file_crc32c(path: str, chunk_bytes: int = DEFAULT_BUFFER_BYTES) -> tuple[int, int]:
    """``(crc32c, size)`` of a file, read through one reused buffer (it was just written: it is cached; a
    buffer that stays in the CPU's cache reads it back in half the CPU of an 8 MiB one)."""
    crc = size = 0
    buf = memoryview(bytearray(chunk_bytes))
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = crc32c(buf[:n], crc)
            size += n
    return crc, size


class _Buffers:
    """Per-column data buffers reused across row groups (no fresh, zero-filled memory per group)."""

    def __init__(self) -> None:
        self.data: list[bytearray] = []

    def get(self, sizes: list[int]) -> list[bytearray]:
        while len(self.data) < len(sizes):
            self.data.append(bytearray())
        for i, size in enumerate(sizes):
            if len(self.data[i]) < size:
                self.data[i] = bytearray(max(size, len(self.data[i]) * 2))
        return self.data[: len(sizes)]


def parquet_schema(fields: Sequence[str]) -> pa.Schema:
    """``__key__`` (string) then one nullable binary column per field, in the given order."""
    return pa.schema(
        [pa.field(KEY_COLUMN, pa.string(), nullable=False)] + [pa.field(f, pa.binary()) for f in fields]
    )


def write_parquet_shard(
    name: str,
    samples: Sequence[Sample[Input]],
    tmp_path: str,
    *,
    fields: Sequence[str],
    row_group_bytes: int,
    compression: str = "none",
    open_threads: int = 0,
    window_bytes: int = 64 << 20,
    on_sample: Callable[[int, int], None] | None = None,
) -> ShardResult:
    """Write ``samples`` as a Parquet shard at ``tmp_path``; return its index entry (named ``name``).

    ``on_sample(payload_bytes, files)`` is called after each row group with its totals.
    """
    result = ShardResult(ShardEntry(name=name, bytes=0, checksum="", keys=[]))
    entry = result.entry
    schema = parquet_schema(fields)
    column_of = {f: i for i, f in enumerate(fields)}
    sizes = [sum(item.entry.size for _, item in s.members) for s in samples]
    buffers = _Buffers()

    def tables() -> Iterator[pa.Table]:
        opened = open_ahead(samples, threads=open_threads, window_bytes=window_bytes)
        for start, stop in plan_row_groups(sizes, row_group_bytes=row_group_bytes):
            before = (result.payload_bytes, result.files)
            group = (next(opened) for _ in range(start, stop))  # opened one by one: no fd per row
            arrays = _row_group(samples[start:stop], group, column_of, result, name, buffers)
            if on_sample is not None:
                on_sample(result.payload_bytes - before[0], result.files - before[1])
            if arrays is not None:
                yield pa.Table.from_arrays(arrays, schema=schema)

    longest: dict[str, int] = {}
    for s in samples:
        for field, item in s.members:
            longest[field] = max(longest.get(field, 0), item.entry.size)
    small = [f for f in fields if longest.get(f, 0) <= STATS_MAX_VALUE_BYTES]
    values = sum(len(s.members) for s in samples)
    rows_per_group = write_tables(
        tmp_path,
        schema,
        tables(),
        compression=compression,
        key_stats=True,
        stats_columns=small,
        write_batch_size=page_batch(sum(sizes), values),
    )
    finish_entry(entry, tmp_path, rows_per_group)
    return result


PAGE_BYTES = 1 << 20  # pyarrow's data_page_size


def page_batch(value_bytes: int, values: int) -> int:
    """pyarrow's ``write_batch_size`` for values of ``value_bytes / values`` bytes on average: pages of
    about :data:`PAGE_BYTES`. (pyarrow checks a page's size after each batch, 1,024 values by default: with
    values of ~100 KB a whole column chunk was one page, buffered whole in fresh memory and written in one
    cold 30 MB write; pages of ~1 MB are written while in cache, for 20-30% less CPU.)"""
    mean = value_bytes // max(1, values)
    return max(1, min(1024, PAGE_BYTES // max(1, mean)))


def write_tables(
    tmp_path: str,
    schema: pa.Schema,
    tables: Iterable[pa.Table],
    *,
    compression: str = "none",
    key_stats: bool = False,
    stats_columns: Sequence[str] = (),
    write_batch_size: int | None = None,
) -> list[int]:
    """Write row groups (tables of ``schema``, ``__key__`` first, one row group each) as a Parquet file at
    ``tmp_path``; return the rows of each group (for :func:`finish_entry`). Dictionaries only for ``__key__``
    and only with ``key_stats`` (sample shards), none otherwise (token shards); statistics for ``__key__``
    (with ``key_stats``) and ``stats_columns`` (fields whose values are all short: what filters prune
    by); page checksums always; ``write_batch_size`` as pyarrow's (:func:`page_batch`). The file is removed
    on any error, including one raised by ``tables``."""
    key_only: list[str] | bool = [KEY_COLUMN] if key_stats else False
    with_stats = ([KEY_COLUMN] if key_stats else []) + list(stats_columns)
    batch = {} if write_batch_size is None else {"write_batch_size": write_batch_size}
    return write_row_groups(
        tmp_path,
        schema,
        tables,
        compression=compression,
        use_dictionary=key_only,
        write_statistics=with_stats or False,
        **batch,
    )


def write_row_groups(
    tmp_path: str, schema: pa.Schema, tables: Iterable[pa.Table], **options: Any
) -> list[int]:
    """Write each of ``tables`` as one row group of a Parquet file at ``tmp_path`` with page checksums and
    ``options`` for ``pyarrow.parquet.ParquetWriter``; return the rows of each group. The file is removed
    on any error, including one raised by ``tables``. A failed write of the file raises
    :class:`~fastload.errors.DestinationWriteError` (errors of ``tables``, reading inputs, pass as is)."""
    rows_per_group: list[int] = []
    writer = None
    try:
        try:
            writer = pq.ParquetWriter(tmp_path, schema, write_page_checksum=True, **options)
        except OSError as exc:
            raise write_error(exc, tmp_path) from exc
        for table in tables:
            try:
                writer.write_table(table, row_group_size=table.num_rows)
            except OSError as exc:
                raise write_error(exc, tmp_path) from exc
            rows_per_group.append(table.num_rows)
        try:
            writer.close()
        except OSError as exc:
            raise write_error(exc, tmp_path) from exc
    except BaseException:
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp_path)
        raise
    return rows_per_group


def finish_entry(entry: ShardEntry, tmp_path: str, rows_per_group: list[int]) -> None:
    """Size, CRC32C and row groups ``(first byte, bytes, rows)`` of the shard written at ``tmp_path``, into
    its index entry. (Reading the file back fails only for the destination's sake:
    :class:`~fastload.errors.DestinationWriteError`.)"""
    try:
        crc, entry.bytes = file_crc32c(tmp_path)
        meta = pq.read_metadata(tmp_path)
        raw = tail_footer(tmp_path)
    except OSError as exc:
        raise write_error(exc, tmp_path) from exc
    entry.checksum = f"{crc:08x}"
    entry.payload = ParquetShard(raw, shard_stats(meta))
    groups = row_groups_of(meta)  # the rows as written; the file must have exactly those groups
    entry.row_groups.extend(
        (first, size, rows) for (first, size, _), rows in zip(groups, rows_per_group, strict=True)
    )


def _row_group(
    listed: Sequence[Sample[Input]],
    group: Iterator[Opened],
    column_of: dict[str, int],
    result: ShardResult,
    shard: str,
    buffers: _Buffers,
) -> list[pa.Array] | None:
    """Read a row group's samples (``listed``, opened one at a time by ``group``: each sample's files are
    closed before the next is taken, so a group of many small files holds few descriptors) into Arrow
    arrays, skipping and reporting samples that fail. Buffers are sized by the listed sizes: a file whose
    size changed is skipped when opened, so what is read never exceeds them."""
    ncols = len(column_of)
    totals = [0] * ncols
    for sample in listed:
        for field_name, item in sample.members:
            totals[column_of[field_name]] += item.entry.size
    offsets: list[list[int]] = [[0] for _ in range(ncols)]
    valid: list[list[bool]] = [[] for _ in range(ncols)]
    fill = [0] * ncols
    keys: list[str] = []
    for field_name, i in column_of.items():
        if totals[i] > _MAX_COLUMN_BYTES:
            raise ValueError(f"column {field_name!r} of one row group exceeds 2 GiB; lower --row-group-size")
    data = buffers.get(totals)
    views = [memoryview(d) for d in data]
    for sample, members, failed in group:
        present: dict[int, int] = {}
        for attempt in range(1, READ_ATTEMPTS + 1):
            present = {}
            try:
                for m in members if failed is None else ():
                    i = column_of[m.field]
                    try:
                        read_exactly(m.file, views[i][fill[i] : fill[i] + m.size])
                    except OSError as exc:
                        failed = Skip(m.item.shown, read_problem(exc))
                        break
                    present[i] = m.size
                if failed is None:
                    failed = changed_while_read(members)
            finally:
                close_all(members)
            if failed is None or failed.reason != CHANGED_WHILE_READ or attempt == READ_ATTEMPTS:
                break
            members, failed = open_sample(sample)  # torn: read it again, from a fresh open
        if failed is not None:
            result.skipped.append(
                Skip(failed.path, f"{failed.reason}; sample {sample.key!r} left out of {shard}")
            )
            continue
        keys.append(sample.key)
        for i in range(ncols):
            got = present.get(i)
            if got is None:
                valid[i].append(False)
            else:
                fill[i] += got
                valid[i].append(True)
            offsets[i].append(fill[i])
        result.payload_bytes += sum(present.values())
        result.files += len(present)
    if not keys:
        return None
    result.entry.keys = list(result.entry.keys) + keys
    arrays: list[pa.Array] = [pa.array(keys, type=pa.string())]
    n = len(keys)
    for i in range(ncols):
        nulls = valid[i].count(False)
        validity = pa.array(valid[i], type=pa.bool_()).buffers()[1] if nulls else None
        offsets_buffer = pa.array(offsets[i], type=pa.int32()).buffers()[1]
        values = pa.py_buffer(data[i])[: fill[i]]
        arrays.append(
            pa.Array.from_buffers(pa.binary(), n, [validity, offsets_buffer, values], null_count=nulls)
        )
    return arrays
