"""Writing one planned shard of a tabular pack (:mod:`fastload.packing.tabular`): :class:`TableShard`, a
:class:`~fastload.packing.engine.ShardJob` whose rows become a fastload Parquet shard: ``__key__``, the
table's columns with their own types, and a binary column per file column holding each row's file bytes
(read ``open_threads`` at a time, one row group at a time, so memory stays within one row group).

Every column but the file bytes has min/max statistics and dictionary encoding; every page its CRC32; a
``--sort-by`` column is recorded as the file's sorting column. A file that cannot be read leaves its row
out (reported like a pack's other skipped inputs).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from fastload.config import PackConfig, S3Config
from fastload.core.index import ShardEntry
from fastload.core.plan import ShardPlan, plan_row_groups
from fastload.errors import Skip
from fastload.formats.parquet.writer import KEY_COLUMN, finish_entry, write_row_groups
from fastload.formats.shard import ShardResult
from fastload.packing.engine import Advance
from fastload.storage import access as storage
from fastload.storage.inputs import read_problem, read_whole


@dataclass(frozen=True, kw_only=True)
class TableShard:
    """One shard of a tabular pack: its plan, its rows (``rows``: ``__key__`` first, in write order), each
    file field's URL per row (None: no file), each row's estimated bytes, the pack's options."""

    plan: ShardPlan
    rows: pa.Table
    files: dict[str, list[str | None]]
    sizes: Sequence[int]
    config: PackConfig
    sort_by: str | None = None
    s3_config: S3Config | None = field(default=None, repr=False)

    @property
    def number(self) -> int:
        return self.plan.number

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def shard_format(self) -> str:
        return "parquet"

    def local_folders(self) -> set[str]:
        return {
            os.path.dirname(u) for urls in self.files.values() for u in urls if u and not storage.is_remote(u)
        }

    def schema(self) -> pa.Schema:
        return pa.schema([*self.rows.schema, *(pa.field(f, pa.binary()) for f in self.files)])

    def write(self, tmp_path: str, *, on_sample: Advance, open_threads: int) -> ShardResult:
        result = ShardResult(ShardEntry(name=self.name, bytes=0, checksum="", keys=[]))
        result.entry.partition = self.plan.partition
        keys: list[str] = []

        def tables() -> Iterator[pa.Table]:
            with ThreadPoolExecutor(max_workers=max(4, open_threads)) as pool:
                for start, stop in plan_row_groups(self.sizes, row_group_bytes=self.config.row_group_bytes):
                    before = (result.payload_bytes, result.files)
                    table = self._group(pool, start, stop, result)
                    on_sample(result.payload_bytes - before[0], result.files - before[1])
                    if table.num_rows:
                        keys.extend(table.column(KEY_COLUMN).to_pylist())
                        yield table

        rows_per_group = write_rows(
            tmp_path, self.schema(), tables(), config=self.config, sort_by=self.sort_by
        )
        result.entry.keys = keys
        finish_entry(result.entry, tmp_path, rows_per_group)
        return result

    def _group(self, pool: ThreadPoolExecutor, start: int, stop: int, result: ShardResult) -> pa.Table:
        """Rows ``[start, stop)`` with their files' bytes; rows whose file failed left out (in ``result``)."""
        urls = [(f, i, self.files[f][i]) for f in self.files for i in range(start, stop)]
        got = list(pool.map(lambda x: _read(x[2], self.s3_config), urls))
        data: dict[str, list[bytes | None]] = {f: [] for f in self.files}
        bad: set[int] = set()
        for (f, i, url), (value, problem) in zip(urls, got, strict=True):
            data[f].append(value)
            if problem is not None:
                bad.add(i)
                key = self.rows.column(KEY_COLUMN)[i].as_py()
                result.skipped.append(Skip(str(url), f"{problem}; sample {key!r} left out of {self.name}"))
        keep = [i - start for i in range(start, stop) if i not in bad]
        part = self.rows.slice(start, stop - start)
        arrays = [*part.columns, *(pa.array(data[f], pa.binary()) for f in self.files)]
        table = pa.Table.from_arrays(arrays, schema=self.schema())
        if bad:
            table = table.take(pa.array(keep, pa.int64()))
        for f in self.files:
            column = table.column(f)
            result.payload_bytes += pc.sum(pc.binary_length(column)).as_py() or 0
            result.files += table.num_rows - column.null_count
        return table


def _read(url: str | None, s3_config: S3Config | None) -> tuple[bytes | None, str | None]:
    """A file's bytes (None for no file), or the problem that kept them from being read."""
    if url is None:
        return None, None
    try:
        return read_whole(url, config=s3_config), None  # (a file changed while read: read again)
    except (OSError, Exception) as exc:  # FastloadError (S3) or OSError: reported as the pack's skips are
        return None, read_problem(exc)


def write_rows(
    tmp_path: str, schema: pa.Schema, tables: Iterator[pa.Table], *, config: PackConfig, sort_by: str | None
) -> list[int]:
    """Write each table as one row group of a Parquet file at ``tmp_path`` (removed on any error); returns
    the rows of each group. Statistics and dictionaries on every column but binary ones; page checksums."""
    typed = [f.name for f in schema if not pa.types.is_binary(f.type)]
    sorting = [pq.SortingColumn(schema.get_field_index(sort_by))] if sort_by is not None else None
    return write_row_groups(
        tmp_path,
        schema,
        tables,
        compression=config.compression,
        use_dictionary=typed,
        write_statistics=typed,
        sorting_columns=sorting,
    )
