"""``fastload verify`` for Parquet shards (and the lint of Parquet files without an index:
:func:`lint_parquet`): the whole file's CRC32C, then every page read with its page checksum checked (pages
written by ``fastload pack`` carry one; older shards' pages have none and are only decoded), the row
groups and keys against the index entry. A damaged page is reported with its row group, column, byte
offset and the keys of the rows it holds."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, BinaryIO

from fastload.core.index import ShardEntry
from fastload.errors import FastloadError, VerifyError
from fastload.formats.checks import crc_problem
from fastload.formats.parquet.arrowfile import open_parquet
from fastload.formats.shard import ChecksumReader
from fastload.storage import access as storage

if TYPE_CHECKING:
    from fastload.config import S3Config

KEY_COLUMN = "__key__"


def verify_parquet(file: BinaryIO, shard: ShardEntry) -> list[VerifyError]:
    """Check a whole Parquet shard (read from its start) against its attached index entry."""
    problems: list[VerifyError] = []
    if shard.checksum:  # (an index of foreign files built from their footers has no whole-file CRC32C)
        reader = ChecksumReader(file)
        reader.drain()
        problems = crc_problem(reader, shard)
        file.seek(0)
    return problems + check_parquet(file, shard)


def _damage(parquet: Any, g: int, first: int, rows: int, shard: ShardEntry, exc: Exception) -> VerifyError:
    """The problem of row group ``g`` that failed to read: which column chunk, where, which keys."""
    meta = parquet.metadata.row_group(g)
    bad, offset = "?", None
    for c in range(meta.num_columns):
        col = meta.column(c)
        try:
            parquet.read_row_group(g, columns=[col.path_in_schema], use_threads=False)
        except Exception:  # pyarrow raises several types for a damaged page
            bad, offset = col.path_in_schema, col.data_page_offset
            break
    last = first + rows - 1
    keys = (
        f"keys {shard.keys[first]!r} .. {shard.keys[last]!r}"
        if 0 <= first <= last < shard.samples
        else f"rows {first}..{last}"
    )
    return VerifyError(
        f"row group {g} ({keys}), column {bad!r}: {exc}; the shard's bytes changed: re-download or "
        "re-pack it",
        shard=shard.name,
        key=shard.keys[first] if first < shard.samples else None,
        offset=offset,
    )


def check_parquet(file: BinaryIO, shard: ShardEntry) -> list[VerifyError]:
    """Every row group read (page checksums checked), its rows and keys against the index entry."""
    try:
        parquet = open_parquet(file, page_checksum_verification=True)
        meta = parquet.metadata
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        return [VerifyError(f"not a readable Parquet file: {exc}", shard=shard.name)]
    problems: list[VerifyError] = []
    rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    if rows != [rg[2] for rg in shard.row_groups]:
        problems.append(
            VerifyError(
                f"row groups hold {rows} rows, index says {[rg[2] for rg in shard.row_groups]}",
                shard=shard.name,
            )
        )
    keys: list[str | None] = []
    for g, n in enumerate(rows):
        try:  # every column: each page's checksum is checked as it is read
            table = parquet.read_row_group(g, use_threads=False)
        except Exception as exc:
            problems.append(_damage(parquet, g, len(keys), n, shard, exc))
            keys += [None] * n
            continue
        keys += (
            table.column(KEY_COLUMN).to_pylist()
            if KEY_COLUMN in table.column_names
            else list(shard.keys[len(keys) : len(keys) + n])
        )  # (a foreign file's keys are a column's or <file>/<row>: the index holds them)
    bad = next(
        (i for i, (a, b) in enumerate(zip(keys, shard.keys, strict=False)) if a is not None and a != b),
        None if len(keys) == shard.samples else min(len(keys), shard.samples),
    )
    if bad is not None:
        problems.append(
            VerifyError(
                f"row {bad} holds key {keys[bad] if bad < len(keys) else None!r}, index says "
                f"{shard.keys[bad] if bad < shard.samples else None!r}",
                shard=shard.name,
                key=shard.keys[bad] if bad < shard.samples else None,
            )
        )
    return problems


def lint_parquet(url: str, *, s3_config: S3Config | None) -> tuple[list[VerifyError], int, int]:
    """Check a Parquet file without an index: its footer, then every row group read (page checksums
    checked where written). Returns its problems, rows and bytes."""
    from fastload.formats.parquet.arrowfile import open_parquet

    name = url.rsplit("/", 1)[-1]
    try:
        f = storage.open_read(url, config=s3_config)
    except (OSError, FastloadError) as exc:
        return [VerifyError(f"cannot read the file ({exc})", shard=name)], 0, 0
    with f:
        size = f.seek(0, io.SEEK_END)
        f.seek(0)
        try:
            parquet = open_parquet(f, page_checksum_verification=True)
            meta = parquet.metadata
        except Exception as exc:  # pyarrow raises several types for a corrupt file
            return [VerifyError(f"not a readable Parquet file: {exc}", shard=name)], 0, size
        problems: list[VerifyError] = []
        first = 0
        for g in range(meta.num_row_groups):
            rows = meta.row_group(g).num_rows
            try:
                parquet.read_row_group(g, use_threads=False)
            except Exception as exc:  # a damaged page: several types
                problems.append(
                    VerifyError(
                        f"row group {g} (rows {first}..{first + rows - 1}) cannot be read: {exc}", shard=name
                    )
                )
            first += rows
        return problems, meta.num_rows, size
