"""``fastload.pack``: a tree of small files into tar, Parquet or TFRecord shards plus ``index.json``.

plan (``packing.plan``: list sources, group files into samples, order and cut shards) -> prepare the
destination, keeping an interrupted run's shards (``packing.journal``) -> an engine (``packing.engine``:
local threads, or Ray) writes each shard (``packing.write``) to a temporary name, publishes it by rename
and journals it -> ``index.json`` last (``packing.report.PackReport`` says what was done).
"""

from __future__ import annotations

import errno
import functools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from typing import Any

from fastload.config import PackConfig, S3Config
from fastload.core.index import INDEX_NAME, parse_index
from fastload.errors import ConfigError, DestinationWriteError, PackError, Skip, SkippedInputError
from fastload.formats.shard import ShardResult
from fastload.gcpause import gc_paused
from fastload.packing.dest import read_index_bytes
from fastload.packing.engine import Engine, LocalEngine
from fastload.packing.journal import finish_pack, open_pack, reopen_pack
from fastload.packing.options import checked, output_options
from fastload.packing.plan import plan_pack, shard_sizes, source_and_target
from fastload.packing.progress import Progress
from fastload.packing.report import PackReport
from fastload.packing.write import file_shards

__all__ = ["PackReport", "pack", "shard_sizes", "source_and_target"]

_DESTINATION_ERRORS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is used up",
    errno.EROFS: "it is on a read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}


def _destination_errors(fn: Callable[..., PackReport]) -> Callable[..., PackReport]:
    """A write to the destination that fails for want of space or permission becomes a :class:`PackError`
    naming the destination and what to do (finished shards are kept for ``--resume``)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> PackReport:
        try:
            return fn(*args, **kwargs)
        except DestinationWriteError:
            raise  # already names the destination (and staging folder) and what to do
        except OSError as exc:
            why = _DESTINATION_ERRORS.get(exc.errno or 0)
            dst = str(kwargs.get("dst", args[1] if len(args) > 1 else "the destination"))
            where = exc.filename if isinstance(exc.filename, str) else dst
            if why is None or (
                exc.errno in (errno.EACCES, errno.EPERM)
                and not where.startswith(os.path.abspath(dst) if not dst.startswith("s3://") else dst)
            ):
                raise
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                todo = (
                    "free some space (or pack elsewhere), then run the same command with --resume: the "
                    "shards finished so far are kept"
                )
            else:
                todo = "choose a destination you can write to (or fix its permissions)"
            detail = f" ({where})" if where != dst else ""
            raise PackError(f"cannot write to {dst}: {why}{detail}; {todo}") from exc

    return wrapper


@_destination_errors
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
    if any(u.startswith("s3://") for u in [*srcs, target]):
        s3_config = s3_config or S3Config.from_env()
    from fastload.packing.tabular import TableOptions, is_table, pack_table

    if rows or file_columns or sort_by is not None or key_column is not None or any(map(is_table, srcs)):
        if engine != "local":
            raise ConfigError("tabular sources are packed by the local engine; leave out --engine ray")
        table_options = TableOptions(file_columns=tuple(file_columns), sort_by=sort_by, key_column=key_column)
        return pack_table(srcs, target, config, table_options, s3_config=s3_config)
    began = time.monotonic()
    with gc_paused():  # planning makes many small objects and no cycles; collections here only cost time
        plan = plan_pack(srcs, config, s3_config)
    if (plan.skipped or plan.unreadable) and not config.allow_skip:
        raise SkippedInputError(plan.skipped + plan.unreadable, written=False, hint=plan.hint)

    names = {p.number: p.name for p in plan.shards}
    dest, journal, kept = open_pack(
        target,
        fingerprint=plan.fingerprint,
        layout=plan.layout,
        resume=config.resume,
        shards=len(plan.shards),
        name_of=names.get,
        s3_config=s3_config,
    )
    if kept is None:  # complete: but the inputs it had to skip may be fixed now
        where, raw = read_index_bytes(dest) or (f"{dest.url}/{INDEX_NAME}", b"")
        index = parse_index(raw, where=where)
        retry = plan.shards_holding({s["path"] for s in index.skipped})
        if retry:
            kept = reopen_pack(
                dest,
                journal,
                index,
                numbers=[p.number for p in plan.shards],
                retry=retry,
                totals=plan.shard_totals,
                name_of=names.get,
                fingerprint=plan.fingerprint,
            )
        else:
            skipped = [Skip(s["path"], s["reason"]) for s in index.skipped]
            if skipped and not config.allow_skip:
                raise SkippedInputError(skipped, written=True)
            return PackReport(
                dest.url,
                index,
                skipped=skipped,
                shards_kept=len(index.shards),
                seconds=time.monotonic() - began,
                already_complete=True,
                notes=plan.notes,
            )

    results: dict[int, ShardResult] = dict(kept)
    done_bytes = sum(r.payload_bytes for r in results.values())
    open_threads = 16 if any(src.startswith("s3://") for src in srcs) else 0
    writer: Engine
    if engine == "ray":
        from fastload.packing.ray_engine import RayEngine

        writer = RayEngine(
            dest.url,
            s3_config=s3_config,
            workers=config.workers,
            open_threads=open_threads,
            address=ray_address,
        )
    else:
        workers = min(config.worker_count, max(1, len(plan.shards) - len(kept)))
        writer = LocalEngine(dest, journal, workers=workers, open_threads=open_threads)
    with Progress(
        total=plan.payload_bytes,
        initial=done_bytes,
        enabled=config.progress,
        desc=f"packing {len(plan.shards)} shards",
    ) as progress:
        try:
            writer.write(
                file_shards(plan, config, skip=kept), advance=progress.advance, done=results.__setitem__
            )
        except BaseException:
            dest.cleanup()
            raise

    report = finish_pack(
        dest,
        journal,
        results,
        numbers=[p.number for p in plan.shards],
        shard_format=config.shard_format,
        fields=plan.fields,
        options={**output_options(config), "layout": plan.layout},
        planned_skips=plan.skipped,
        kept=len(kept),
        allow_skip=config.allow_skip,
        seconds=time.monotonic() - began,
        empty_files=plan.empty_files,
    )
    report.notes = plan.notes
    return report
