"""``fastload.pack``: a tree of small files into tar, Parquet or TFRecord shards plus ``index.json``.

list sources -> group files into samples (core.keys) -> order and cut shards (core.plan) -> write shards
in parallel to temporary names, publish each by rename, journal it -> write ``index.json`` last.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from fastload.config import PackConfig, S3Config
from fastload.core.index import INDEX_NAME, DatasetIndex, ShardEntry, parse_index
from fastload.core.keys import KeyRuleError, Sample, group_samples, partition_value, split_key
from fastload.core.plan import ShardPlan, parquet_file_overhead, parquet_row_bytes, plan_shards, sample_order
from fastload.errors import ConfigError, PackError, Skip, SkippedInputError
from fastload.formats.tar.header import END_OF_ARCHIVE, member_size
from fastload.formats.tar.writer import ShardResult, write_tar_shard
from fastload.gcpause import gc_paused
from fastload.packing.dest import Destination, destination
from fastload.packing.journal import STATE_DIR, PackJournal
from fastload.packing.progress import Progress
from fastload.storage.inputs import Input
from fastload.storage.listing import FileEntry, LocalSource

if TYPE_CHECKING:
    from fastload.storage.s3source import S3Source


@dataclass
class PackReport:
    """What a pack did."""

    dst: str
    index: DatasetIndex
    skipped: list[Skip] = field(default_factory=list)
    shards_written: int = 0
    shards_kept: int = 0
    files: int = 0
    seconds: float = 0.0
    already_complete: bool = False

    def summary(self) -> str:
        idx = self.index
        if self.already_complete:
            return (
                f"nothing to do: {self.dst} already holds this pack ({idx.samples:,} samples in "
                f"{len(idx.shards)} {idx.shard_format} shard(s)); skipped {len(self.skipped)} input(s)"
            )
        mb = idx.payload_bytes / 1e6
        rate = (
            f", {self.files / self.seconds:,.0f} files/s, {mb / self.seconds:,.1f} MB/s"
            if self.seconds
            else ""
        )
        lines = [
            f"packed {idx.samples:,} samples ({self.files:,} files, {mb:,.1f} MB) into {len(idx.shards)} "
            f"{idx.shard_format} shard(s) in {self.dst} in {self.seconds:.1f}s{rate}",
        ]
        if self.shards_kept:
            lines.append(f"resumed: kept {self.shards_kept} finished shard(s), wrote {self.shards_written}")
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} input(s):")
            lines += [f"  {s}" for s in self.skipped[:50]]
            if len(self.skipped) > 50:
                lines.append(f"  ... and {len(self.skipped) - 50} more (all listed in index.json)")
        else:
            lines.append("skipped nothing")
        return "\n".join(lines)


@dataclass
class _Plan:
    samples: list[Sample[Input]]
    shards: list[ShardPlan]
    fields: list[str]
    skipped: list[Skip]
    layout: str  # options, names and sizes: recorded in index.json
    fingerprint: str  # layout plus mtimes/ETags: guards --resume against changed files
    payload_bytes: int
    files: int


def _list_sources(
    sources: Sequence[str], s3_config: S3Config | None
) -> tuple[list[tuple[str, Input]], list[Skip], list[tuple[str, str]]]:
    items: list[tuple[str, Input]] = []
    skipped: list[Skip] = []
    bad_keys: list[tuple[str, str]] = []
    for src in sources:
        if src.startswith("s3://"):
            from fastload.storage.s3source import S3Source

            source: LocalSource | S3Source = S3Source(src, config=s3_config)
        else:
            source = LocalSource(src)
        for found in source.list():
            if isinstance(found, FileEntry):
                if found.size == 0:
                    problem = Skip(_join(source.root, found.relpath), "empty file")
                else:
                    items.append((found.relpath, Input(source, found)))
                    continue
                relpath = found.relpath
            else:
                problem = Skip(_join(source.root, found.path), found.reason)
                relpath = found.path
            skipped.append(problem)
            with contextlib.suppress(KeyRuleError):
                bad_keys.append((split_key(relpath)[0], f"{problem.path} was skipped ({problem.reason})"))
    return items, skipped, bad_keys


def _plan(sources: Sequence[str], config: PackConfig, s3_config: S3Config | None) -> _Plan:
    items, skipped, bad_keys = _list_sources(sources, s3_config)
    samples, rejected = group_samples(items, bad_keys)
    skipped += [Skip(r.item.shown, r.reason) for r in rejected]
    partitions: list[str | None] | None = None
    if config.partition_level is not None:
        kept: list[Sample[Input]] = []
        partitions = []
        for s in samples:
            try:
                value = partition_value(s.key, config.partition_level)
            except KeyRuleError as exc:
                skipped += [Skip(item.shown, f"sample {s.key!r} {exc}") for _, item in s.members]
                continue
            kept.append(s)
            partitions.append(f"{config.partition_column}={value}")
        samples = kept
    if not samples:
        where = ", ".join(sources)
        raise PackError(
            f"no samples found in {where}: it holds no regular files with an extension"
            + (f" ({len(skipped)} input(s) skipped)" if skipped else "")
        )
    order = sample_order(len(samples), partitions, seed=config.shuffle_seed)
    samples = [samples[i] for i in order]
    if partitions is not None:
        partitions = [partitions[i] for i in order]
    fields_seen = {f for s in samples for f, _ in s.members}
    sizes, overhead, suffix = shard_sizes(config, samples, len(fields_seen))
    shards = plan_shards(
        sizes,
        partitions,
        shard_bytes=config.shard_size_bytes,
        max_samples=config.max_samples,
        prefix=config.prefix,
        suffix=suffix,
        overhead_bytes=overhead,
    )
    layout = hashlib.sha256(json.dumps(config.output_options(), sort_keys=True).encode())
    versions = hashlib.sha256()
    fields: set[str] = set()
    payload = files = 0
    for s in samples:
        layout.update(s.key.encode("utf-8", "surrogateescape") + b"\0")
        for f, it in s.members:
            fields.add(f)
            payload += it.entry.size
            files += 1
            layout.update(
                b"%s\0%s\0%d\n" % (f.encode(), it.relpath.encode("utf-8", "surrogateescape"), it.entry.size)
            )
            versions.update(it.entry.version.encode() + b"\n")
    return _Plan(
        samples,
        shards,
        sorted(fields),
        skipped,
        layout.hexdigest(),
        layout.hexdigest() + versions.hexdigest(),
        payload,
        files,
    )


def _join(root: str, relpath: str) -> str:
    return root + relpath if root.endswith("/") else os.path.join(root, relpath)


def source_and_target(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    dst: str | os.PathLike[str],
    *,
    missing: str,
) -> tuple[list[str], str]:
    """Sources and destination as strings; a destination inside a local source is refused (its output
    would be read as input)."""
    srcs = (
        [os.fspath(sources)] if isinstance(sources, (str, os.PathLike)) else [os.fspath(s) for s in sources]
    )
    if not srcs:
        raise ConfigError(f"no source given; {missing}")
    target = os.fspath(dst)
    for src in srcs:
        if not src.startswith("s3://") and not target.startswith("s3://"):
            a, b = os.path.realpath(src), os.path.realpath(target)
            if b == a or b.startswith(a.rstrip(os.sep) + os.sep):
                raise ConfigError(
                    f"destination {target} is inside the source {src}; what is written there would be "
                    "read as input: choose a destination outside the source"
                )
    return srcs, target


def shard_sizes(
    config: PackConfig, samples: Sequence[Sample[Input]], n_fields: int
) -> tuple[list[int], int, str]:
    """Each sample's exact bytes in a shard of ``config.shard_format``, the per-shard overhead and the
    shard name suffix: what :func:`~fastload.core.plan.plan_shards` cuts shards by."""
    if config.shard_format == "tar":
        sizes = [sum(member_size(f"{s.key}.{f}", it.entry.size) for f, it in s.members) for s in samples]
        return sizes, len(END_OF_ARCHIVE), ".tar"
    if config.shard_format == "tfrecord":
        from fastload.formats.tfrecord.writer import sample_record_size

        sizes = [sample_record_size(s.key, [(f, it.entry.size) for f, it in s.members]) for s in samples]
        return sizes, 0, ".tfrecord"
    sizes = [parquet_row_bytes(s.key, [it.entry.size for _, it in s.members]) for s in samples]
    groups = config.shard_size_bytes // config.row_group_bytes + 1
    return sizes, parquet_file_overhead(n_fields, groups), ".parquet"


def pack(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    dst: str | os.PathLike[str],
    config: PackConfig | None = None,
    *,
    s3_config: S3Config | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    **options: Any,
) -> PackReport:
    """Pack the files under ``sources`` (local folders or ``s3://`` prefixes) into shards plus
    ``index.json`` in ``dst`` (a local folder or an ``s3://`` prefix).

    ``options`` override fields of ``config`` (see :class:`PackConfig`); ``s3_config`` defaults to
    :meth:`S3Config.from_env`. Raises :class:`~fastload.errors.SkippedInputError` when inputs had to be
    left out and ``allow_skip`` is false: before writing anything for problems seen while listing, after
    writing for files that vanished or became unreadable during the run.

    ``engine="ray"`` writes the shards as Ray tasks (:mod:`fastload.packing.ray_engine`) on the cluster at
    ``ray_address`` (default: ``RAY_ADDRESS``, a running local cluster, else a new local one); the output
    is the same, byte for byte.
    """
    if engine not in ("local", "ray"):
        raise ConfigError(f"engine={engine!r}; choose 'local' or 'ray'")
    if engine == "ray":
        from fastload.packing.ray_engine import require_ray

        require_ray(ray_address)
    elif ray_address is not None:
        raise ConfigError("ray_address only applies with engine='ray' (--engine ray)")
    config = replace(config or PackConfig(), **options) if options else (config or PackConfig())
    srcs, target = source_and_target(sources, dst, missing="pass the folder holding the files to pack")
    if any(u.startswith("s3://") for u in [*srcs, target]):
        s3_config = s3_config or S3Config.from_env()
    began = time.monotonic()
    with gc_paused():  # planning makes many small objects and no cycles; collections here only cost time
        plan = _plan(srcs, config, s3_config)
    if plan.skipped and not config.allow_skip:
        raise SkippedInputError(plan.skipped, written=False)

    dest = destination(
        target if target.startswith("s3://") else os.path.abspath(target), STATE_DIR, config=s3_config
    )
    journal = PackJournal(dest)
    kept = _prepare_destination(dest, journal, plan, config)
    if kept is None:  # already complete
        index = parse_index(dest.read_bytes(INDEX_NAME) or b"", where=f"{dest.url}/{INDEX_NAME}")
        return PackReport(
            dest.url,
            index,
            skipped=[Skip(s["path"], s["reason"]) for s in index.skipped],
            shards_kept=len(index.shards),
            seconds=time.monotonic() - began,
            already_complete=True,
        )

    results: dict[int, ShardResult] = dict(kept)
    todo = [p for p in plan.shards if p.number not in results]
    done_bytes = sum(r.payload_bytes for r in results.values())
    remote = any(src.startswith("s3://") for src in srcs)
    with Progress(
        total=plan.payload_bytes,
        initial=done_bytes,
        enabled=config.progress,
        desc=f"packing {len(plan.shards)} shards",
    ) as progress:
        try:
            if engine == "ray":
                from fastload.packing.ray_engine import write_on_ray

                write_on_ray(
                    todo,
                    plan.samples,
                    plan.fields,
                    config,
                    dest.url,
                    s3_config,
                    results,
                    progress.advance,
                    remote=remote,
                    address=ray_address,
                )
            else:
                _write_all(todo, plan, config, dest, journal, results, progress.advance, remote=remote)
        except BaseException:
            dest.cleanup()
            raise

    written_skips = [s for n in sorted(results) for s in results[n].skipped]
    index = DatasetIndex(
        shard_format=config.shard_format,
        fields=plan.fields,
        shards=[results[p.number].entry for p in plan.shards],
        options={**config.output_options(), "layout": plan.layout},
        skipped=[{"path": s.path, "reason": s.reason} for s in plan.skipped + written_skips],
        payload_bytes=sum(r.payload_bytes for r in results.values()),
    )
    dest.write_bytes(INDEX_NAME, index.to_json())
    journal.remove()
    report = PackReport(
        dest.url,
        index,
        skipped=plan.skipped + written_skips,
        shards_written=len(todo),
        shards_kept=len(kept),
        files=sum(r.files for r in results.values()),
        seconds=time.monotonic() - began,
    )
    if written_skips and not config.allow_skip:
        raise SkippedInputError(written_skips, written=True)
    return report


def _prepare_destination(
    dest: Destination, journal: PackJournal, plan: _Plan, config: PackConfig
) -> dict[int, ShardResult] | None:
    """Set up the destination; return the shards a resumed run keeps, or None if already complete."""
    if dest.exists_as_file():
        raise PackError(f"destination {dest.url} is a file; choose a folder")
    if config.resume:
        if journal.exists():
            if journal.fingerprint() != plan.fingerprint:
                raise PackError(
                    f"the source files or pack options changed since the interrupted pack in {dest.url}, so "
                    "its shards cannot be reused; delete the destination and pack again, or restore the "
                    "source"
                )
            dest.prepare()
            return _kept_shards(dest, journal, plan)
        raw = dest.read_bytes(INDEX_NAME)
        if raw is not None:
            done = parse_index(raw, where=f"{dest.url}/{INDEX_NAME}")
            if done.options.get("layout") == plan.layout:
                return None
            raise PackError(
                f"{dest.url} holds a finished pack of other files or options; pack into an empty "
                "destination instead of resuming"
            )
    if not dest.is_empty():
        hint = "pass --resume to continue the interrupted pack there, or " if journal.exists() else ""
        raise PackError(f"destination {dest.url} is not empty; {hint}choose an empty or new folder")
    dest.prepare()
    journal.start(plan.fingerprint, len(plan.shards))
    return {}


def _kept_shards(dest: Destination, journal: PackJournal, plan: _Plan) -> dict[int, ShardResult]:
    kept: dict[int, ShardResult] = {}
    names = {p.number: p.name for p in plan.shards}
    for number, record in journal.finished().items():
        entry = ShardEntry.from_dict(record["entry"])
        if names.get(number) != entry.name or dest.size(entry.name) != entry.bytes:
            continue
        kept[number] = ShardResult(
            entry,
            [Skip(s["path"], s["reason"]) for s in record["skipped"]],
            int(record["payload_bytes"]),
            int(record["files"]),
        )
    return kept


def _write_all(
    todo: list[ShardPlan],
    plan: _Plan,
    config: PackConfig,
    dest: Destination,
    journal: PackJournal,
    results: dict[int, ShardResult],
    advance: Callable[[int, int], None],
    *,
    remote: bool,
) -> None:
    open_threads = 16 if remote else 0

    def one(shard: ShardPlan) -> ShardResult:
        tmp = os.path.join(dest.tmp_dir, f"{shard.number:06d}.part")
        samples = plan.samples[shard.start : shard.stop]
        if config.shard_format == "tar":
            result = write_tar_shard(
                shard.name, samples, tmp, fsync=config.fsync, on_sample=advance, open_threads=open_threads
            )
        elif config.shard_format == "tfrecord":
            from fastload.formats.tfrecord.writer import write_tfrecord_shard

            result = write_tfrecord_shard(
                shard.name, samples, tmp, fsync=config.fsync, on_sample=advance, open_threads=open_threads
            )
        else:
            from fastload.formats.parquet.writer import write_parquet_shard

            result = write_parquet_shard(
                shard.name,
                samples,
                tmp,
                fields=plan.fields,
                row_group_bytes=config.row_group_bytes,
                compression=config.compression,
                on_sample=advance,
                open_threads=open_threads,
            )
        result.entry.partition = shard.partition
        dest.publish(tmp, shard.name)
        journal.record(
            {
                "number": shard.number,
                "entry": result.entry.to_dict(),
                "skipped": [{"path": s.path, "reason": s.reason} for s in result.skipped],
                "payload_bytes": result.payload_bytes,
                "files": result.files,
            }
        )
        return result

    with ThreadPoolExecutor(max_workers=min(config.worker_count, max(1, len(todo)))) as pool:
        futures: dict[Future[ShardResult], ShardPlan] = {pool.submit(one, s): s for s in todo}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for fut in finished:
                exc = fut.exception()
                if exc is not None:
                    for other in pending:
                        other.cancel()
                    raise exc
                results[futures[fut].number] = fut.result()
