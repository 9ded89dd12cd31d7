"""The Parquet shard format: planning sizes, the writer, the read path (rows by row group) and verify.

A shard's samples are rows, its index entry lists the row groups ``(offset, size, rows)``. Files written by
other tools are indexed from their footers (:mod:`.foreign`) and read the same way; column values become
sample values as :mod:`.values` says.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from fastload.core.index import DatasetIndex, ShardEntry
from fastload.core.plan import parquet_file_overhead, parquet_row_bytes
from fastload.errors import VerifyError

if TYPE_CHECKING:
    from fastload.config import PackConfig, S3Config
    from fastload.core.keys import Sample
    from fastload.formats.tar.writer import ShardResult
    from fastload.storage.inputs import Input

RawSample = dict[str, Any]
KEY_COLUMN = "__key__"


class ParquetSamples:
    """Rows of one indexed Parquet shard: whole row groups are read, then the wanted rows picked. Each page's
    CRC (written by ``fastload pack``) is checked as it is read: a damaged page raises
    :class:`~fastload.errors.VerifyError` naming the shard, the row group and its keys."""

    def __init__(self, entry: ShardEntry, file: BinaryIO) -> None:
        self.entry = entry
        self._file = file
        self._lock = threading.Lock()  # pyarrow reads through the file position

    def close(self) -> None:
        pass  # the file belongs to the caller

    def load(
        self, positions: Sequence[int], columns: Sequence[str] | None = None, *, defer: bool = False
    ) -> Callable[[], Iterable[RawSample]]:
        rows = self.read_rows(positions, columns)
        return lambda: rows

    def read_rows(self, positions: Sequence[int], columns: Sequence[str] | None) -> list[RawSample]:
        """The rows at index ``positions``, in that order; ``columns`` projects fields (the key stays)."""
        from fastload.formats.parquet.arrowfile import open_parquet
        from fastload.formats.parquet.values import read_columns, sample_rows

        with self._lock:
            entry = self.entry
            self._file.seek(0)
            parquet = open_parquet(self._file, page_checksum_verification=True)
            starts = [0]
            for rg in entry.row_groups:
                starts.append(starts[-1] + rg[2])
            wanted = set(positions)
            names = parquet.schema_arrow.names
            cols = read_columns(names, columns)
            rows: dict[int, RawSample] = {}
            ordered = sorted(wanted)
            for g in range(len(entry.row_groups)):  # the row groups holding a wanted row
                i = bisect.bisect_left(ordered, starts[g])
                if i == len(ordered) or ordered[i] >= starts[g + 1]:
                    continue
                table = self._row_group(parquet, g, cols, starts)
                rows.update(
                    sample_rows(
                        table,
                        first=starts[g],
                        wanted=wanted,
                        keys=entry.keys,
                        keep_nulls=KEY_COLUMN not in names,
                    )
                )
            return [rows[p] for p in positions]

    def _row_group(self, parquet: Any, g: int, cols: list[str] | None, starts: list[int]) -> Any:
        """Row group ``g`` as columns; a page that fails its checksum raises :class:`VerifyError`."""
        try:
            return parquet.read_row_group(g, columns=cols, use_threads=False)  # (see arrowfile)
        except OSError as exc:
            if "checksum" not in str(exc).lower():
                raise
            keys = self.entry.keys
            first, last = keys[starts[g]], keys[starts[g + 1] - 1]
            raise VerifyError(
                f"row group {g} (keys {first!r}..{last!r}) has a page that fails its checksum ({exc}): the "
                "shard was damaged after packing; run `fastload verify` and re-pack or re-download it (with "
                "cache_dir=, a damaged cached copy is fetched again)",
                shard=self.entry.name,
                key=first,
                offset=self.entry.row_groups[g][0],
            ) from None


class ParquetFormat:
    """``shard_format="parquet"``: a row per sample, a ``__key__`` column and a binary column per field."""

    name = "parquet"
    label = "Parquet"
    suffixes: tuple[str, ...] = (".parquet",)
    pack_options: tuple[str, ...] = ("row_group_bytes", "compression")
    foreign = True
    projects_columns = True

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
        return ParquetSamples(entry, file)

    def verify(self, file: BinaryIO, shard: ShardEntry) -> list[VerifyError]:
        from fastload.formats.parquet.check import verify_parquet

        return verify_parquet(file, shard)

    def lint(self, url: str, *, s3_config: S3Config | None) -> tuple[list[VerifyError], int, int]:
        from fastload.formats.parquet.check import lint_parquet

        return lint_parquet(url, s3_config=s3_config)

    def describe(self, index: DatasetIndex) -> list[str]:
        return []


PARQUET = ParquetFormat()
