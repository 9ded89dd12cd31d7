"""The Parquet shard format: planning sizes, the writer, the read path and verify.

A shard's samples are rows; its index entry lists the row groups ``(offset, size, rows)`` and its sample
table holds its footer. The read path fetches only the column chunks asked for (:class:`ParquetSamples`)
and selects the rows a filter keeps (:mod:`.select`, before planning). Files written by other tools are
indexed from their footers (:mod:`.foreign`) and read the same way; column values become sample values as
:mod:`.values` says.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from fastload.core.filters import Filter
from fastload.core.index import DatasetIndex, ShardEntry
from fastload.core.plan import parquet_file_overhead, parquet_row_bytes
from fastload.core.projection import GAP_BYTES, coalesce
from fastload.core.readplan import runs
from fastload.errors import VerifyError
from fastload.formats.parquet import footer
from fastload.formats.parquet.payload import ParquetShard, footer_of, read_parquet_payload, stats_of
from fastload.formats.parquet.sparse import SparseFile
from fastload.formats.registry import ShardFormat

FETCH_THREADS = 8  # column-chunk ranges of one load fetched at once

if TYPE_CHECKING:
    from fastload.config import PackConfig, S3Config
    from fastload.core.keys import Sample
    from fastload.formats.shard import ShardResult
    from fastload.storage.inputs import Input

RawSample = dict[str, Any]
KEY_COLUMN = "__key__"


class ParquetSamples:
    """Rows of one indexed Parquet shard. A load fetches, with the shard's ranged ``read``, only the column
    chunks of the columns asked for (:func:`.values.read_columns`: ``__key__`` comes from the index) in the
    row groups holding the rows wanted, their byte ranges taken from the footer (:mod:`.footer`) and merged
    where close (:func:`~fastload.core.projection.coalesce`); pyarrow then decodes them from those bytes.
    Each page's
    CRC (written by ``fastload pack``) is checked as it is decoded: a damaged page raises
    :class:`~fastload.errors.VerifyError` naming the shard, the row group and its keys."""

    gap_bytes = GAP_BYTES  # column chunks closer than this are fetched with one read

    def __init__(
        self, entry: ShardEntry, read: Callable[[int, int], bytes], *, concurrent: bool = False
    ) -> None:
        """``concurrent``: fetch a load's several ranges at once (a remote shard, where each is a round
        trip); ``read`` must then be thread-safe."""
        self.entry = entry
        self._read = read
        self._concurrent = concurrent
        # the whole shard in memory, its CRC32C checked (ShardRead.data): decoded from it, pages not checked
        # again (pyarrow's page CRC costs ~5 ms per 2 MB shard; the file's CRC32C covers every byte)
        self._data: bytes | None = getattr(read, "data", None)
        self._starts = [0]
        for rg in entry.row_groups:
            self._starts.append(self._starts[-1] + rg[2])
        self.row_starts: Sequence[int] = self._starts  # row group g holds rows [starts[g], starts[g + 1])

    def close(self) -> None:
        pass  # the file belongs to the caller

    def metadata(self) -> Any:
        """The shard's parsed footer (recorded in its table, else read from its tail; cached)."""
        meta = self.__dict__.get("_meta")
        if meta is None:
            e = self.entry
            raw = footer_of(e)
            key = footer.cache_key(e.name, e.bytes, e.checksum, raw)
            meta = self._meta = footer.metadata(key, e.bytes, raw, self._read, where=e.name)
        return meta

    def select(self, flt: Filter, partition: Mapping[str, Any]) -> tuple[list[tuple[int, int]], int]:
        """``(runs of the rows kept by flt, bytes fetched to decide)``: :func:`.select.select_rows`."""
        from fastload.formats.parquet.select import select_rows

        return select_rows(self, flt, partition)

    def names(self, meta: Any) -> list[str]:
        """The shard's top-level column names."""
        names = self.__dict__.get("_names")
        if names is None:
            names = self._names = meta.schema.to_arrow_schema().names
        return names  # type: ignore[no-any-return]

    def group_of(self, position: int) -> int:
        return bisect.bisect_right(self._starts, position) - 1

    def groups_of(self, positions: Sequence[int]) -> list[int]:
        """The row groups holding ``positions``, ascending (by run: a read's positions are runs)."""
        if len(positions) > 16:  # (a shuffled read's positions are many short runs: one search for all)
            found = np.searchsorted(self._starts, np.asarray(positions, dtype=np.int64), side="right") - 1
            return np.unique(found).tolist()  # type: ignore[no-any-return]
        groups: set[int] = set()
        starts = self._starts
        for first, stop in runs(positions):
            groups.update(range(self.group_of(first), bisect.bisect_left(starts, stop)))
        return sorted(groups)

    def load(
        self, positions: Sequence[int], columns: Sequence[str] | None = None, *, defer: bool = False
    ) -> Callable[[], Iterable[RawSample]]:
        """Fetch the column chunks the rows at ``positions`` need now; the returned function decodes them
        into samples, in the order of ``positions``."""
        from fastload.formats.parquet.values import read_columns

        meta = self.metadata()
        cols = read_columns(self.names(meta), columns)
        groups = self.groups_of(positions)
        pieces = self.fetch(meta, groups, cols) if self._data is None else []
        return lambda: self._rows(meta, pieces, groups, positions, cols)

    def fetch(self, meta: Any, groups: Sequence[int], cols: Sequence[str] | None) -> list[tuple[int, bytes]]:
        """``(offset, bytes)`` of the coalesced column-chunk ranges of ``cols`` in row groups ``groups``."""
        wanted = [r for g in groups for r in footer.column_chunks(meta, g, cols)]
        ranges = coalesce(wanted, gap_bytes=self.gap_bytes)
        many = getattr(self._read, "many", None)  # the caller's pool (ShardReaders: one for a pass)
        if len(ranges) < 2 or not (self._concurrent or many is not None):
            return [(a, self._read(a, b - a)) for a, b in ranges]
        # several ranges (projected chunks of several row groups): fetched at once, not a round trip each
        # one after another (``read`` is thread-safe; the store's gate bounds S3 requests)
        if many is not None:
            return list(zip((a for a, _ in ranges), many(ranges), strict=True))
        with ThreadPoolExecutor(max_workers=min(FETCH_THREADS, len(ranges))) as pool:
            got = list(pool.map(lambda r: self._read(r[0], r[1] - r[0]), ranges))
        return [(a, data) for (a, _), data in zip(ranges, got, strict=True)]

    def decode(
        self, meta: Any, pieces: Sequence[tuple[int, bytes]], group: int, cols: Sequence[str] | None
    ) -> Any:
        """Row group ``group`` (its chunks among ``pieces``) as a pyarrow table; a page that fails its
        checksum raises :class:`VerifyError`."""
        return self.decode_groups(meta, pieces, [group], cols)

    def decode_groups(
        self,
        meta: Any,
        pieces: Sequence[tuple[int, bytes]],
        groups: Sequence[int],
        cols: Sequence[str] | None,
    ) -> Any:
        """Row groups ``groups`` (ascending; their chunks among ``pieces``) as one pyarrow table, decoded in
        one call; a page that fails its checksum raises :class:`VerifyError` naming its row group."""
        import pyarrow as pa

        from fastload.formats.parquet.arrowfile import open_parquet

        if self._data is not None:
            source, check = pa.BufferReader(self._data), False
        else:
            source, check = SparseFile(self.entry.bytes, pieces, self._read), True
        parquet = open_parquet(source, metadata=meta, page_checksum_verification=check)
        try:
            if len(groups) == 1:
                return parquet.read_row_group(groups[0], columns=cols, use_threads=False)  # (see arrowfile)
            return parquet.read_row_groups(groups, columns=cols, use_threads=False)
        except OSError as exc:
            if "checksum" not in str(exc).lower():
                raise
            if len(groups) > 1:  # which one: each decoded alone (only on this error path)
                for g in groups:
                    self.decode_groups(meta, pieces, [g], cols)
            raise self._damaged(groups[0], exc) from None

    def _damaged(self, group: int, exc: OSError) -> VerifyError:
        keys, starts = self.entry.keys, self._starts
        first, last = keys[starts[group]], keys[starts[group + 1] - 1]
        return VerifyError(
            f"row group {group} (keys {first!r}..{last!r}) has a page that fails its checksum ({exc}): "
            "the shard was damaged after packing; run `fastload verify` and re-pack or re-download it "
            "(with cache_dir=, a damaged cached copy is fetched again)",
            shard=self.entry.name,
            key=first,
            offset=self.entry.row_groups[group][0],
        )

    def _rows(
        self,
        meta: Any,
        pieces: Sequence[tuple[int, bytes]],
        groups: Sequence[int],
        positions: Sequence[int],
        cols: Sequence[str] | None,
    ) -> list[RawSample]:
        """The samples at ``positions``: their row groups decoded in one call, the rows made in bulk."""
        from fastload.formats.parquet.values import sample_rows

        starts = self._starts
        rows = [p for g in groups for p in range(starts[g], starts[g + 1])]  # the decoded table's rows
        table = self.decode_groups(meta, pieces, groups, cols)
        keep_nulls = KEY_COLUMN not in self.names(meta)  # (a foreign file: nulls are values)
        return sample_rows(table, rows=rows, positions=positions, keys=self.entry.keys, keep_nulls=keep_nulls)


class ParquetFormat(ShardFormat):
    """``shard_format="parquet"``: a row per sample, a ``__key__`` column and a binary column per field."""

    name = "parquet"
    label = "Parquet"
    suffixes: tuple[str, ...] = (".parquet",)
    pack_options: tuple[str, ...] = ("row_group_bytes", "compression")
    foreign = True
    projects_columns = True
    read_as_folder = True  # pandas, pyarrow.dataset, Spark, DuckDB read its datasets by listing the folder
    selects_rows = True  # ParquetSamples.select: the rows a filter keeps, by statistics and filter columns
    # ParquetSamples.load takes any positions in any order (it reads their row groups): a shard that fits in
    # one read task is planned without its sample table (core.readplan.iter_reads(whole=))
    any_positions = True
    keys_from_column = True  # table(..., key_column=): keys from a column of foreign files

    def matches(self, name: str) -> bool:
        return name.endswith(self.suffixes)

    def sample_sizes(
        self, samples: Sequence[Sample[Input]], *, n_fields: int, config: PackConfig
    ) -> tuple[list[int], int]:
        sizes = [parquet_row_bytes(s.key, [it.entry.size for _, it in s.members]) for s in samples]
        groups = config.shard_size_bytes // config.row_group_bytes + 1
        return sizes, parquet_file_overhead(n_fields, groups)

    def write(
        self,
        name: str,
        samples: Sequence[Sample[Input]],
        tmp_path: str,
        *,
        fields: Sequence[str],
        config: PackConfig,
        on_sample: Callable[[int, int], None] | None = None,
        open_threads: int = 0,
    ) -> ShardResult:
        from fastload.formats.parquet.writer import write_parquet_shard

        return write_parquet_shard(
            name,
            samples,
            tmp_path,
            fields=fields,
            row_group_bytes=config.row_group_bytes,
            compression=config.compression,
            on_sample=on_sample,
            open_threads=open_threads,
        )

    def check_entry(self, entry: ShardEntry) -> str | None:
        if sum(rg[2] for rg in entry.row_groups) != entry.samples:
            return "lacks row groups; re-run `fastload pack`"
        return None

    def read_payload(self, entry: ShardEntry) -> ParquetShard | None:
        return read_parquet_payload(entry)  # its footer (sample table) and column statistics (index.json)

    def column_stats(self, entry: ShardEntry) -> dict[str, list[Any]]:
        return stats_of(entry)

    def table(
        self,
        named: Sequence[tuple[str, str]],
        *,
        threads: int,
        s3_config: S3Config | None,
        key_column: str | None = None,
    ) -> tuple[DatasetIndex, list[VerifyError]]:
        from fastload.formats.parquet.foreign import scan_parquet_files

        return scan_parquet_files(named, threads=threads, s3_config=s3_config, key_column=key_column)

    def samples(
        self, entry: ShardEntry, *, read: Callable[[int, int], bytes], file: BinaryIO, fd: int | None
    ) -> ParquetSamples:
        return ParquetSamples(entry, read, concurrent=fd is None)  # (a remote shard: round trips)

    def whole_entry(self, entry: ShardEntry, data: bytes) -> ShardEntry | None:
        """``entry`` (detached) completed from the whole shard's bytes ``data`` (the caller checked them
        against the entry's size and CRC32C), as its sample table would: the footer, the row groups and the
        keys (its ``__key__`` column), so a read of all of a shard fetches it in one request and no table.
        None for a file without a ``__key__`` column (a foreign file's keys are in its table only)."""
        import pyarrow as pa

        from fastload.formats.parquet.arrowfile import open_parquet

        raw = footer.read_footer(lambda at, n: data[at : at + n], len(data), where=entry.name)
        key = footer.cache_key(entry.name, entry.bytes, entry.checksum, raw)
        meta = footer.metadata(key, entry.bytes, raw, lambda at, n: data[at : at + n], where=entry.name)
        if KEY_COLUMN not in meta.schema.to_arrow_schema().names:
            return None
        parquet = open_parquet(pa.BufferReader(data), metadata=meta)  # (checked whole: no page CRCs)
        keys = parquet.read(columns=[KEY_COLUMN], use_threads=False).column(0).to_pylist()
        groups = footer.row_groups_of(meta)
        if len(keys) != entry.samples or sum(rows for _, _, rows in groups) != entry.samples:
            raise VerifyError(
                f"{len(keys)} rows, index.json says {entry.samples}: the shard is not the one indexed; "
                "run `fastload verify` and re-pack",
                shard=entry.name,
            )
        payload = ParquetShard(raw, stats_of(entry))
        return dataclasses.replace(entry, keys=keys, count=None, row_groups=groups, payload=payload)

    def verify(self, file: BinaryIO, shard: ShardEntry) -> list[VerifyError]:
        from fastload.formats.parquet.check import verify_parquet

        return verify_parquet(file, shard)

    def lint(self, url: str, *, s3_config: S3Config | None) -> tuple[list[VerifyError], int, int]:
        from fastload.formats.parquet.check import lint_parquet

        return lint_parquet(url, s3_config=s3_config)

    def describe(self, index: DatasetIndex) -> list[str]:
        return []


PARQUET = ParquetFormat()
