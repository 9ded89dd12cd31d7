"""``fastload pack`` of tabular sources: Parquet, CSV or JSONL files of rows (a manifest with an image path
column and labels, an export of a table), each row one sample, into fastload Parquet shards with statistics.

read the tables (:func:`read_tables`; a folder: every ``.parquet``/``.csv``/``.jsonl`` file in it) ->
keys (``key_column``, else ``<table file stem>/<row:06d>``; unique) -> order (``sort_by``: rows sorted by
that column, so the shards' and row groups' min/max of it are tight and period filters prune well; or
``shuffle_seed``; else as read) -> the files named by ``file_columns`` (paths relative to the table's
folder, local or on S3) sized (a missing one is skipped like a pack's other inputs) -> shards cut by bytes
(:func:`~fastload.core.plan.plan_shards`) -> :class:`~fastload.packing.table_shards.TableShard` jobs on the
pack's engine, journal and resume (the fingerprint covers the tables' bytes, the options and the files'
names, sizes and mtimes) -> ``index.json`` last.

``file_columns`` entries are ``COLUMN`` (the bytes replace the path) or ``COLUMN=FIELD`` (the bytes go to
a new column ``FIELD``, e.g. ``image=jpg`` so that decoding by extension makes it an image; the path stays).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from fastload.config import PackConfig, S3Config
from fastload.core.index import DatasetIndex
from fastload.core.plan import ShardPlan, plan_shards, sample_order
from fastload.errors import ConfigError, PackError, Skip, SkippedInputError
from fastload.formats.parquet.writer import KEY_COLUMN
from fastload.formats.shard import ShardResult
from fastload.packing.append import run_append
from fastload.packing.dest import Destination
from fastload.packing.driver import Plan, Target, pack_report, results_index, run
from fastload.packing.engine import Engine, LocalEngine, ShardJob
from fastload.packing.journal import PackJournal
from fastload.packing.options import output_options
from fastload.packing.report import PackReport
from fastload.packing.table_shards import TableShard
from fastload.packing.tablenames import TABLE_SUFFIXES, is_table
from fastload.storage import access as storage
from fastload.storage.inputs import read_problem


@dataclass(frozen=True, kw_only=True)
class TableOptions:
    """What a tabular pack adds to :class:`~fastload.config.PackConfig` (all part of the fingerprint)."""

    file_columns: tuple[str, ...] = ()
    sort_by: str | None = None
    key_column: str | None = None

    def file_fields(self) -> dict[str, str]:
        """``{column: field}`` of the file columns (``COLUMN=FIELD``, or the column's own name)."""
        out: dict[str, str] = {}
        for spec in self.file_columns:
            column, _, name = spec.partition("=")
            if not column or "=" in name or column in out:
                raise ConfigError(f"file column {spec!r}: give COLUMN or COLUMN=FIELD, each column once")
            out[column] = name or column
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "file_columns": list(self.file_columns),
            "sort_by": self.sort_by,
            "key_column": self.key_column,
        }


def table_files(sources: Sequence[str], s3_config: S3Config | None) -> list[str]:
    """The table files of ``sources``: each a table file, or a folder/prefix of them (sorted; names under
    ``_``/``.`` folders left out)."""
    out: list[str] = []
    for src in sources:
        url = storage.normalise(src)
        folder = (
            storage.list_files(url, "", config=s3_config) if storage.is_remote(url) else os.path.isdir(url)
        )
        if is_table(url) and not folder:  # (Spark writes a table as a folder named events.parquet/)
            out.append(url)
            continue
        found = [
            u
            for u in storage.list_files(url, "", config=s3_config)
            if is_table(u) and not any(p.startswith(("_", ".")) for p in u[len(url) :].split("/") if p)
        ]
        if not found:
            raise ConfigError(f"{url} holds no table files ({', '.join('*' + s for s in TABLE_SUFFIXES)})")
        out += found
    return out


def read_table(url: str, data: bytes) -> pa.Table:
    """One table file's rows (pyarrow's readers: types inferred for CSV and JSONL)."""
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson

    from fastload.formats.parquet.arrowfile import open_parquet

    lower = url.lower()
    try:
        if lower.endswith(".parquet"):
            return open_parquet(pa.BufferReader(data)).read(use_threads=False)
        if lower.endswith(".csv"):
            return pacsv.read_csv(io.BytesIO(data))
        return pajson.read_json(io.BytesIO(data))
    except (pa.ArrowException, ValueError) as exc:
        raise ConfigError(f"{url}: not a readable table ({exc})") from None


def _folder(url: str) -> str:
    return url.rsplit("/", 1)[0] if storage.is_remote(url) else os.path.dirname(url)


def _stem(url: str, root: str) -> str:
    name = url[len(root) :].lstrip("/") if url.startswith(root) else url.rsplit("/", 1)[-1]
    return name.rsplit(".", 1)[0]


@dataclass(frozen=True, kw_only=True)
class TablePlan:
    """Rows in write order (``__key__`` first), each file field's URL per row, shards, and the pack's
    digests: ``layout`` (tables' bytes, options, file names and sizes) and ``fingerprint`` (+ mtimes)."""

    rows: pa.Table
    files: dict[str, list[str | None]]
    sizes: list[int]
    shards: list[ShardPlan]
    fields: list[str]
    skipped: list[Skip]
    layout: str
    fingerprint: str
    payload_bytes: int


def plan_table_pack(
    sources: Sequence[str], config: PackConfig, options: TableOptions, s3_config: S3Config | None
) -> TablePlan:
    """Read the tables, key, order, size the files and cut the shards; write nothing."""
    urls = table_files(sources, s3_config)
    root = (
        os.path.commonpath([_folder(u) for u in urls]) if not storage.is_remote(urls[0]) else _folder(urls[0])
    )
    layout = hashlib.sha256(json.dumps([output_options(config), options.to_dict()], sort_keys=True).encode())
    file_fields = options.file_fields()
    tables, keys, files = [], [], {f: [] for f in file_fields.values()}  # type: ignore[var-annotated]
    for url in urls:
        data = storage.read_bytes(url, config=s3_config)
        layout.update(url[len(root) :].encode() + b"\0" + hashlib.sha256(data).digest())
        table = read_table(url, data)
        for column, name in file_fields.items():
            if column not in table.column_names:
                raise ConfigError(
                    f"{url} has no column {column!r} (file_columns); it has {table.column_names}"
                )
            base = _folder(url)
            files[name] += [
                None if p is None else storage.join(base, p) for p in table.column(column).to_pylist()
            ]
        if options.key_column is not None:
            if options.key_column not in table.column_names:
                raise ConfigError(f"{url} has no column {options.key_column!r} (key_column)")
            keys += [None if k is None else str(k) for k in table.column(options.key_column).to_pylist()]
        else:
            stem = _stem(url, root)
            keys += [f"{stem}/{i:06d}" for i in range(table.num_rows)]
        tables.append(table.drop_columns([c for c, n in file_fields.items() if c == n]))
    try:
        rows = pa.concat_tables(tables, promote_options="default")
    except pa.ArrowException as exc:
        raise ConfigError(f"the tables {', '.join(urls)} do not share their columns ({exc})") from None
    if KEY_COLUMN in rows.column_names:
        rows = rows.drop_columns([KEY_COLUMN])
    _check_keys(keys, options.key_column)
    rows = rows.add_column(0, KEY_COLUMN, pa.array(keys, pa.string()))
    order = _order(rows, config, options)
    if order is not None:
        rows = rows.take(pa.array(order, pa.int64()))
        files = {f: [urls_[i] for i in order] for f, urls_ in files.items()}
    sizes, skipped, versions = _file_sizes(files, rows, s3_config)
    if skipped:
        keep = [i for i in range(rows.num_rows) if sizes[i] >= 0]
        rows = rows.take(pa.array(keep, pa.int64()))
        files = {f: [u[i] for i in keep] for f, u in files.items()}
        sizes = [sizes[i] for i in keep]
    for f, u in files.items():
        layout.update(f.encode() + b"\0" + "\0".join(x or "" for x in u).encode("utf-8", "surrogateescape"))
    layout.update(np.asarray(sizes, np.int64).tobytes())
    per_row = rows.nbytes // max(1, rows.num_rows)
    cut = [per_row + s for s in sizes]
    shards = plan_shards(
        cut,
        None,
        shard_bytes=config.shard_size_bytes,
        max_samples=config.max_samples,
        prefix=config.prefix,
        suffix=".parquet",
        overhead_bytes=4096,
    )
    fields = sorted([c for c in rows.column_names if c != KEY_COLUMN] + list(files))
    return TablePlan(
        rows=rows,
        files=files,
        sizes=cut,
        shards=shards,
        fields=fields,
        skipped=skipped,
        layout=layout.hexdigest(),
        fingerprint=layout.hexdigest() + hashlib.sha256(versions.encode()).hexdigest(),
        payload_bytes=sum(sizes),
    )


def _check_keys(keys: Sequence[str | None], key_column: str | None) -> None:
    seen: set[str] = set()
    for i, k in enumerate(keys):
        if k is None:
            raise ConfigError(
                f"row {i} has no {key_column!r} (null), which names samples; pick another key_column"
            )
        if k in seen:
            raise ConfigError(
                f"key {k!r} names two rows in column {key_column!r}; give a column of unique values"
            )
        seen.add(k)


def _order(rows: pa.Table, config: PackConfig, options: TableOptions) -> list[int] | None:
    """Row positions in write order: sorted by ``sort_by`` (stable; nulls last), shuffled, or None."""
    if options.sort_by is not None:
        if config.shuffle_seed is not None:
            raise ConfigError("sort_by and shuffle_seed contradict each other; give one")
        if options.sort_by not in rows.column_names:
            raise ConfigError(
                f"sort_by={options.sort_by!r}: no such column; the rows have {rows.column_names}"
            )
        import pyarrow.compute as pc

        return pc.sort_indices(rows, sort_keys=[(options.sort_by, "ascending")]).to_pylist()  # type: ignore[no-any-return]
    if config.shuffle_seed is not None:
        return sample_order(rows.num_rows, None, seed=config.shuffle_seed)
    return None


def _file_sizes(
    files: dict[str, list[str | None]], rows: pa.Table, s3_config: S3Config | None
) -> tuple[list[int], list[Skip], str]:
    """Each row's file bytes (-1: a file of the row is missing, and skipped), the skips, and the files'
    versions (mtimes locally) for the fingerprint."""
    n = rows.num_rows
    sizes = [0] * n
    skipped: list[Skip] = []
    versions: list[str] = []

    def stat(url: str) -> tuple[int, str] | str:
        try:
            if storage.is_remote(url):
                return storage.size_of(url, config=s3_config), ""
            st = os.stat(url)
            if not os.path.isfile(url):
                return "is not a regular file"
            return st.st_size, str(st.st_mtime_ns)
        except (OSError, Exception) as exc:  # NotFoundError (S3) and OSError alike
            return "missing (no such file)" if isinstance(exc, FileNotFoundError) else read_problem(exc)

    keys = rows.column(KEY_COLUMN).to_pylist()
    with ThreadPoolExecutor(max_workers=16) as pool:
        for urls in files.values():
            for i, (url, got) in enumerate(
                zip(urls, pool.map(lambda u: stat(u) if u else (0, ""), urls), strict=True)
            ):
                if isinstance(got, str):
                    if sizes[i] >= 0:
                        skipped.append(Skip(str(url), f"{got}; row {keys[i]!r} left out"))
                    sizes[i] = -1
                elif sizes[i] >= 0:
                    sizes[i] += got[0]
                    versions.append(got[1])
    return sizes, skipped, "\n".join(versions)


def pack_table(
    sources: Sequence[str],
    target: str,
    config: PackConfig,
    options: TableOptions,
    *,
    s3_config: S3Config | None = None,
) -> PackReport:
    """Pack the rows of tabular ``sources`` into Parquet shards plus ``index.json`` at ``target`` (see the
    module docstring); resumes like ``fastload pack``."""
    if config.shard_format != "parquet":
        raise ConfigError(
            f"tabular sources pack into Parquet shards (typed columns and statistics): pass --format parquet "
            f"(got {config.shard_format!r})"
        )
    if config.partition_level is not None:
        raise ConfigError("--partition-by groups files by folder; it does not apply to the rows of a table")
    plan = plan_table_pack(sources, config, options, s3_config)
    if plan.skipped and not config.allow_skip:
        raise SkippedInputError(plan.skipped, written=False)
    if not plan.rows.num_rows:
        raise PackError(f"no rows to pack in {', '.join(sources)}")
    rows = RowsPlan(plan, config, options, target, s3_config=s3_config)
    return (run_append if config.append else run)(rows)


class RowsPlan(Plan[PackReport]):
    """The driver's plan of a pack of table rows: :class:`~fastload.packing.table_shards.TableShard` jobs on
    the local engine."""

    def __init__(
        self,
        plan: TablePlan,
        config: PackConfig,
        options: TableOptions,
        url: str,
        *,
        s3_config: S3Config | None,
    ) -> None:
        self.plan, self.config, self.options, self.s3_config = plan, config, options, s3_config
        self._names = {p.number: p.name for p in plan.shards}
        self.target = Target(
            url=url,
            fingerprint=plan.fingerprint,
            layout=plan.layout,
            shards=len(plan.shards),
            resume=config.resume,
            allow_skip=config.allow_skip,
            progress=config.progress,
            s3_config=s3_config,
        )

    def name_of(self, number: int) -> str | None:
        return self._names.get(number)

    def engine(self, dest: Destination, journal: PackJournal, todo: int | None) -> Engine:
        return LocalEngine(dest, journal, workers=min(self.config.worker_count, todo or 1), open_threads=16)

    def jobs(self, dest: Destination, kept: Mapping[int, ShardResult]) -> Iterable[ShardJob]:
        plan = self.plan
        return (
            TableShard(
                plan=shard,
                rows=plan.rows.slice(shard.start, shard.count),
                files={f: u[shard.start : shard.stop] for f, u in plan.files.items()},
                sizes=plan.sizes[shard.start : shard.stop],
                config=self.config,
                sort_by=self.options.sort_by,
                s3_config=self.s3_config,
            )
            for shard in plan.shards
            if shard.number not in kept
        )

    def progress_total(self) -> int | None:
        return self.plan.payload_bytes

    def output_options(self) -> dict[str, Any]:
        return {**output_options(self.config), "kind": "table", **self.options.to_dict()}

    def index(self, results: Mapping[int, ShardResult]) -> DatasetIndex:
        return results_index(
            results,
            numbers=[p.number for p in self.plan.shards],
            shard_format="parquet",
            fields=self.plan.fields,
            options={**self.output_options(), "layout": self.plan.layout},
            planned_skips=self.plan.skipped,
        )

    def report(
        self, url: str, index: DatasetIndex, results: Mapping[int, ShardResult], *, kept: int, seconds: float
    ) -> PackReport:
        return pack_report(
            url,
            index,
            results,
            planned_skips=self.plan.skipped,
            kept=kept,
            seconds=seconds,
            shards=len(self.plan.shards),
        )

    def complete(self, url: str, index: DatasetIndex, *, skipped: list[Skip], seconds: float) -> PackReport:
        return PackReport(
            url, index, skipped=skipped, shards_kept=len(index.shards), seconds=seconds, already_complete=True
        )
