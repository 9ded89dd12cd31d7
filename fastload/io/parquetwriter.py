"""Writing one Parquet shard: one row per sample, ``__key__`` plus one binary column per field.

Each row group's column data is read from the input files straight into Arrow buffers (no per-sample
``bytes`` objects), so a sample's bytes are held once, and memory stays within one row group.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Sequence
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq
from crc32c import crc32c

from fastload.core.index import ShardEntry
from fastload.core.keys import Sample
from fastload.core.plan import plan_row_groups
from fastload.errors import Skip
from fastload.io.inputs import Input, ShrunkError, read_exactly
from fastload.io.listing import read_problem
from fastload.io.tarwriter import ShardResult

KEY_COLUMN = "__key__"
_MAX_COLUMN_BYTES = (1 << 31) - 1


class _ChecksumSink(io.RawIOBase):
    """A write-only file that computes CRC32C of everything written through it."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.crc = 0
        self.pos = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        self.crc = crc32c(view, self.crc)
        total = len(view)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        self.pos += total
        return total

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
        super().close()


def parquet_schema(fields: Sequence[str]) -> pa.Schema:
    """``__key__`` (string) then one nullable binary column per field, in the given order."""
    return pa.schema(
        [pa.field(KEY_COLUMN, pa.string(), nullable=False)] + [pa.field(f, pa.binary()) for f in fields]
    )


def _read_sample(sample: Sample[Input]) -> tuple[list[tuple[str, BinaryIO, int]], Skip | None]:
    """Open a sample's files and stat them; on failure close what was opened and say why."""
    opened: list[tuple[str, BinaryIO, int]] = []
    for field_name, item in sample.members:
        try:
            f = item.open()
        except OSError as exc:
            failed = Skip(item.shown, read_problem(exc))
            break
        try:
            size = os.fstat(f.fileno()).st_size
        except OSError as exc:  # pragma: no cover - fstat on an open file practically never fails
            f.close()
            failed = Skip(item.shown, read_problem(exc))
            break
        opened.append((field_name, f, size))
        if size == 0:
            failed = Skip(item.shown, "empty file (it was emptied after it was listed)")
            break
    else:
        return opened, None
    for _, f, _ in opened:
        f.close()
    return [], failed


def write_parquet_shard(
    name: str,
    samples: Sequence[Sample[Input]],
    tmp_path: str,
    *,
    fields: Sequence[str],
    row_group_bytes: int,
    compression: str = "none",
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
    sink = _ChecksumSink(tmp_path)
    try:
        writer = pq.ParquetWriter(
            sink,
            schema,
            compression=compression,
            use_dictionary=[KEY_COLUMN],
            write_statistics=[KEY_COLUMN],
        )
        rows_per_group: list[int] = []
        for start, stop in plan_row_groups(sizes, row_group_bytes=row_group_bytes):
            before = (result.payload_bytes, result.files)
            arrays = _row_group(samples[start:stop], column_of, result, name)
            if on_sample is not None:
                on_sample(result.payload_bytes - before[0], result.files - before[1])
            if arrays is not None:
                writer.write_table(pa.Table.from_arrays(arrays, schema=schema), row_group_size=len(arrays[0]))
                rows_per_group.append(len(arrays[0]))
        writer.close()
        sink.close()
    except BaseException:
        sink.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp_path)
        raise
    entry.bytes = sink.pos
    entry.checksum = f"{sink.crc:08x}"
    meta = pq.read_metadata(tmp_path)
    for i, rows in enumerate(rows_per_group):
        rg = meta.row_group(i)
        starts = []
        total = 0
        for c in range(rg.num_columns):
            col = rg.column(c)
            first = col.data_page_offset
            if col.has_dictionary_page and col.dictionary_page_offset is not None:
                first = min(first, col.dictionary_page_offset)
            starts.append(first)
            total += col.total_compressed_size
        entry.row_groups.append((min(starts), total, rows))
    return result


def _row_group(
    samples: Sequence[Sample[Input]], column_of: dict[str, int], result: ShardResult, shard: str
) -> list[pa.Array] | None:
    """Read a row group's samples into Arrow arrays (skipping, and reporting, samples that fail)."""
    kept: list[tuple[Sample[Input], list[tuple[str, BinaryIO, int]]]] = []
    for sample in samples:
        opened, failed = _read_sample(sample)
        if failed is not None:
            result.skipped.append(
                Skip(failed.path, f"{failed.reason}; sample {sample.key!r} left out of {shard}")
            )
            continue
        kept.append((sample, opened))
    try:
        ncols = len(column_of)
        totals = [0] * ncols
        for _, opened in kept:
            for field_name, _, size in opened:
                totals[column_of[field_name]] += size
        for field_name, i in column_of.items():
            if totals[i] > _MAX_COLUMN_BYTES:
                raise ValueError(
                    f"column {field_name!r} of one row group exceeds 2 GiB; lower --row-group-size"
                )
        data = [bytearray(t) for t in totals]
        views = [memoryview(d) for d in data]
        offsets = [[0] for _ in range(ncols)]
        valid: list[list[bool]] = [[] for _ in range(ncols)]
        fill = [0] * ncols
        keys: list[str] = []
        for sample, opened in kept:
            present: dict[int, int] = {}
            ok = True
            for field_name, f, size in opened:
                i = column_of[field_name]
                try:
                    read_exactly(f, views[i][fill[i] : fill[i] + size])
                except OSError as exc:
                    item = dict(sample.members)[field_name]
                    reason = str(exc) if isinstance(exc, ShrunkError) else read_problem(exc)
                    result.skipped.append(
                        Skip(item.shown, f"{reason}; sample {sample.key!r} left out of {shard}")
                    )
                    ok = False
                    break
                present[i] = size
            if not ok:
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
    finally:
        for _, opened in kept:
            for _, f, _ in opened:
                f.close()
    if not keys:
        return None
    result.entry.keys.extend(keys)
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
