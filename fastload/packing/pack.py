"""``fastload.pack``: a tree of small files into tar, Parquet or TFRecord shards plus ``index.json``.

plan (``packing.plan``: list sources, group files into samples, order and cut shards) -> :class:`FilesPlan`
run by the pack driver (``packing.driver``): prepare the destination, keeping an interrupted run's shards
(``packing.journal``) -> an engine (``packing.engine``: local threads, or Ray) writes each shard
(``packing.write``) to a temporary name, publishes it by rename and journals it -> ``index.json`` last
(``packing.report.PackReport`` says what was done).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields, replace
from typing import Any

from fastload.config import PackConfig, S3Config
from fastload.core.index import DatasetIndex
from fastload.errors import ConfigError, Skip, SkippedInputError
from fastload.formats.shard import ShardResult
from fastload.gcpause import gc_paused
from fastload.packing.append import run_append
from fastload.packing.dest import Destination
from fastload.packing.driver import Plan, Retry, Target, destination_errors, pack_report, results_index, run
from fastload.packing.engine import Engine, LocalEngine, ShardJob
from fastload.packing.journal import PackJournal
from fastload.packing.options import checked, output_options
from fastload.packing.plan import PackPlan, plan_pack, shard_sizes, source_and_target
from fastload.packing.report import PackReport
from fastload.packing.tablenames import is_table
from fastload.packing.write import file_shards

__all__ = ["PackReport", "pack", "shard_sizes", "source_and_target"]


def pack(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    dst: str | os.PathLike[str],
    config: PackConfig | None = None,
    *,
    s3_config: S3Config | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    rows: bool = False,
    file_columns: Sequence[str] = (),
    sort_by: str | None = None,
    key_column: str | None = None,
    **options: Any,
) -> PackReport:
    """Pack the files under ``sources`` (local folders or ``s3://`` prefixes) into shards plus
    ``index.json`` in ``dst`` (a local folder or an ``s3://`` prefix).

    ``options`` override fields of ``config`` (see :class:`PackConfig`); ``s3_config`` defaults to
    :meth:`S3Config.from_env`. Raises :class:`~fastload.errors.SkippedInputError` when inputs had to be
    left out and ``allow_skip`` is false: before writing anything for problems seen while listing, after
    writing for files that vanished or became unreadable during the run. A pack that skipped inputs is not
    complete: with ``resume`` the shards of those that can be listed again (fixed since) are written again,
    the others kept, giving what a fresh pack gives (:func:`~fastload.packing.journal.reopen_pack`).
    Hidden files and folders are left out unless ``include_hidden``, and so are paths matching ``exclude``
    globs; ``prefix_sources`` starts each key with its source folder's name.

    ``engine="local"`` writes the shards with ``workers`` threads here; ``engine="ray"`` as Ray tasks
    (:class:`~fastload.packing.ray_engine.RayEngine`) on the cluster at ``ray_address`` (default:
    ``RAY_ADDRESS``, a running local cluster, else a new local one); the output is the same, byte for byte.

    Tabular sources (``rows``, or a source named ``*.parquet``/``*.csv``/``*.jsonl``, or any of
    ``file_columns``, ``sort_by``, ``key_column``): each row of the tables is a sample, packed into Parquet
    shards with statistics (:mod:`fastload.packing.tabular`).
    """
    if engine not in ("local", "ray"):
        raise ConfigError(f"engine={engine!r}; choose 'local' or 'ray'")
    if engine == "ray" and (options.get("append") or (config is not None and config.append)):
        raise ConfigError("--append runs on the local engine for now; leave out --engine ray")
    if engine == "ray":
        from fastload.packing.ray_engine import require_ray

        require_ray(ray_address)
    elif ray_address is not None:
        raise ConfigError("ray_address only applies with engine='ray' (--engine ray)")
    unknown = sorted(set(options) - {f.name for f in fields(PackConfig)})
    if unknown:
        known = ", ".join(sorted(f.name for f in fields(PackConfig)))
        raise ConfigError(f"unknown pack option(s) {', '.join(unknown)}; PackConfig has: {known}")
    config = checked(replace(config or PackConfig(), **options) if options else (config or PackConfig()))
    srcs, target = source_and_target(sources, dst, missing="pass the folder holding the files to pack")
    if any(u.startswith(("s3://", "gs://", "az://")) for u in [*srcs, target]):
        s3_config = s3_config or S3Config.from_env()
    if rows or file_columns or sort_by is not None or key_column is not None or any(map(is_table, srcs)):
        from fastload.packing.tabular import TableOptions, pack_table

        if engine != "local":
            raise ConfigError("tabular sources are packed by the local engine; leave out --engine ray")
        table_options = TableOptions(file_columns=tuple(file_columns), sort_by=sort_by, key_column=key_column)
        return pack_table(srcs, target, config, table_options, s3_config=s3_config)  # (appends too)
    with destination_errors(target), gc_paused():
        plan = plan_pack(srcs, config, s3_config)  # (planning makes many small objects and no cycles)
    if (plan.skipped or plan.unreadable) and not config.allow_skip:
        raise SkippedInputError(plan.skipped + plan.unreadable, written=False, hint=plan.hint)
    files = FilesPlan(
        plan, config, target, srcs=srcs, s3_config=s3_config, engine=engine, address=ray_address
    )
    return run_append(files) if config.append else run(files)


class FilesPlan(Plan[PackReport]):
    """The driver's plan of a pack of files (:class:`~fastload.packing.plan.PackPlan` cut into
    :class:`~fastload.packing.write.FileShard` jobs) on the local or the Ray engine; a finished pack's shards
    holding inputs it had to skip are written again if those can be listed now."""

    def __init__(
        self,
        plan: PackPlan,
        config: PackConfig,
        url: str,
        *,
        srcs: list[str],
        s3_config: S3Config | None,
        engine: str = "local",
        address: str | None = None,
    ) -> None:
        self.plan, self.config, self.srcs = plan, config, srcs
        self.s3_config, self.engine_name, self.address = s3_config, engine, address
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

    def _numbers(self) -> list[int]:
        return [p.number for p in self.plan.shards]

    def retry(self, index: DatasetIndex) -> Retry | None:
        held = self.plan.shards_holding({s["path"] for s in index.skipped})
        return Retry(self._numbers(), frozenset(held), self.plan.shard_totals) if held else None

    def engine(self, dest: Destination, journal: PackJournal, todo: int | None) -> Engine:
        open_threads = 16 if any(src.startswith("s3://") for src in self.srcs) else 0
        if self.engine_name == "ray":
            from fastload.packing.ray_engine import RayEngine

            return RayEngine(
                dest.url,
                s3_config=self.s3_config,
                workers=self.config.workers,
                open_threads=open_threads,
                address=self.address,
            )
        workers = min(self.config.worker_count, todo or 1)
        return LocalEngine(dest, journal, workers=workers, open_threads=open_threads)

    def jobs(self, dest: Destination, kept: Mapping[int, ShardResult]) -> Iterable[ShardJob]:
        return file_shards(self.plan, self.config, skip=kept)

    def progress_total(self) -> int | None:
        return self.plan.payload_bytes

    def output_options(self) -> dict[str, Any]:
        return output_options(self.config)

    def index(self, results: Mapping[int, ShardResult]) -> DatasetIndex:
        return results_index(
            results,
            numbers=self._numbers(),
            shard_format=self.config.shard_format,
            fields=self.plan.fields,
            options={**output_options(self.config), "layout": self.plan.layout},
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
            empty_files=self.plan.empty_files,
            notes=self.plan.notes,
        )

    def complete(self, url: str, index: DatasetIndex, *, skipped: list[Skip], seconds: float) -> PackReport:
        return PackReport(
            url,
            index,
            skipped=skipped,
            shards_kept=len(index.shards),
            seconds=seconds,
            already_complete=True,
            notes=self.plan.notes,
        )
