"""``fastload.pack``: a tree of small files into tar or Parquet shards plus ``index.json``.

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
from typing import Any

from fastload.config import PackConfig
from fastload.core.index import INDEX_NAME, DatasetIndex, ShardEntry, parse_index
from fastload.core.keys import KeyRuleError, Sample, group_samples, partition_value, split_key
from fastload.core.plan import ShardPlan, plan_shards, sample_order
from fastload.core.tar import END_OF_ARCHIVE, member_size
from fastload.errors import ConfigError, PackError, Skip, SkippedInputError
from fastload.io.inputs import Input
from fastload.io.journal import STATE_DIR, PackJournal
from fastload.io.listing import FileEntry, LocalSource
from fastload.io.localfs import atomic_write, publish
from fastload.io.parquetwriter import write_parquet_shard
from fastload.io.tarwriter import ShardResult, write_tar_shard
from fastload.progress import Progress


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

    def summary(self) -> str:
        idx = self.index
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
    fingerprint: str
    payload_bytes: int
    files: int


def _list_sources(
    sources: Sequence[str],
) -> tuple[list[tuple[str, Input]], list[Skip], list[tuple[str, str]]]:
    items: list[tuple[str, Input]] = []
    skipped: list[Skip] = []
    bad_keys: list[tuple[str, str]] = []
    for src in sources:
        source = LocalSource(src)
        for found in source.list():
            if isinstance(found, FileEntry):
                if found.size == 0:
                    problem = Skip(os.path.join(source.root, found.relpath), "empty file")
                else:
                    items.append((found.relpath, Input(source, found)))
                    continue
                relpath = found.relpath
            else:
                problem = Skip(os.path.join(source.root, found.path), found.reason)
                relpath = found.path
            skipped.append(problem)
            with contextlib.suppress(KeyRuleError):
                bad_keys.append((split_key(relpath)[0], f"{problem.path} was skipped ({problem.reason})"))
    return items, skipped, bad_keys


def _plan(sources: Sequence[str], config: PackConfig) -> _Plan:
    items, skipped, bad_keys = _list_sources(sources)
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
    if config.shard_format == "tar":
        sizes = [sum(member_size(f"{s.key}.{f}", it.entry.size) for f, it in s.members) for s in samples]
        overhead, suffix = len(END_OF_ARCHIVE), ".tar"
    else:
        sizes = [sum(it.entry.size for _, it in s.members) for s in samples]
        overhead, suffix = 0, ".parquet"
    shards = plan_shards(
        sizes,
        partitions,
        shard_bytes=config.shard_size_bytes,
        max_samples=config.max_samples,
        prefix=config.prefix,
        suffix=suffix,
        overhead_bytes=overhead,
    )
    digest = hashlib.sha256(json.dumps(config.output_options(), sort_keys=True).encode())
    fields: set[str] = set()
    payload = files = 0
    for s in samples:
        digest.update(s.key.encode("utf-8", "surrogateescape") + b"\0")
        for f, it in s.members:
            fields.add(f)
            payload += it.entry.size
            files += 1
            digest.update(
                b"%s\0%s\0%d\0%d\n"
                % (
                    f.encode(),
                    it.relpath.encode("utf-8", "surrogateescape"),
                    it.entry.size,
                    it.entry.mtime_ns,
                )
            )
    return _Plan(samples, shards, sorted(fields), skipped, digest.hexdigest(), payload, files)


def pack(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    dst: str | os.PathLike[str],
    config: PackConfig | None = None,
    **options: Any,
) -> PackReport:
    """Pack the files under ``sources`` into shards plus ``index.json`` in ``dst``.

    ``options`` override fields of ``config`` (see :class:`PackConfig`). Raises
    :class:`~fastload.errors.SkippedInputError` when inputs had to be left out and ``allow_skip`` is
    false: before writing anything for problems seen while listing, after writing for files that
    vanished or became unreadable during the run.
    """
    config = replace(config or PackConfig(), **options) if options else (config or PackConfig())
    srcs = (
        [os.fspath(sources)] if isinstance(sources, (str, os.PathLike)) else [os.fspath(s) for s in sources]
    )
    if not srcs:
        raise ConfigError("no source given; pass the folder holding the files to pack")
    for s in srcs:
        if s.startswith("s3://"):
            raise ConfigError(f"{s}: packing from S3 is not supported yet; copy the files locally first")
    dst = os.path.abspath(os.fspath(dst))
    began = time.monotonic()
    plan = _plan(srcs, config)
    if plan.skipped and not config.allow_skip:
        raise SkippedInputError(plan.skipped, written=False)

    journal = PackJournal(dst)
    kept = _prepare_destination(dst, journal, plan, config)
    if kept is None:  # already complete
        index = parse_index(_read(os.path.join(dst, INDEX_NAME)), where=os.path.join(dst, INDEX_NAME))
        return PackReport(
            dst,
            index,
            skipped=[Skip(s["path"], s["reason"]) for s in index.skipped],
            shards_kept=len(index.shards),
            seconds=time.monotonic() - began,
        )

    results: dict[int, ShardResult] = dict(kept)
    todo = [p for p in plan.shards if p.number not in results]
    done_bytes = sum(r.payload_bytes for r in results.values())
    with Progress(
        total=plan.payload_bytes,
        initial=done_bytes,
        enabled=config.progress,
        desc=f"packing {len(plan.shards)} shards",
    ) as progress:
        try:
            _write_all(todo, plan, config, dst, journal, results, progress.advance)
        finally:
            journal.close()

    written_skips = [s for n in sorted(results) for s in results[n].skipped]
    index = DatasetIndex(
        shard_format=config.shard_format,
        fields=plan.fields,
        shards=[results[p.number].entry for p in plan.shards],
        options={**config.output_options(), "fingerprint": plan.fingerprint},
        skipped=[{"path": s.path, "reason": s.reason} for s in plan.skipped + written_skips],
        payload_bytes=sum(r.payload_bytes for r in results.values()),
    )
    atomic_write(os.path.join(dst, INDEX_NAME), index.to_json())
    journal.remove()
    report = PackReport(
        dst,
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


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _prepare_destination(
    dst: str, journal: PackJournal, plan: _Plan, config: PackConfig
) -> dict[int, ShardResult] | None:
    """Set up ``dst`` for writing; return the shards a resumed run keeps, or None if already complete."""
    index_path = os.path.join(dst, INDEX_NAME)
    if config.resume and not journal.exists() and os.path.exists(index_path):
        done = parse_index(_read(index_path), where=index_path)
        if done.options.get("fingerprint") == plan.fingerprint:
            return None
        raise PackError(
            f"{dst} holds a finished pack of other files or options; "
            "pack into an empty folder instead of resuming"
        )
    if config.resume and journal.exists():
        if journal.fingerprint() != plan.fingerprint:
            raise PackError(
                f"the source files or pack options changed since the interrupted pack in {dst}, so its "
                "shards cannot be reused; delete the folder and pack again, or restore the source"
            )
        return _kept_shards(dst, journal, plan)
    if os.path.isdir(dst) and os.listdir(dst):
        hint = (
            "pass --resume to continue the interrupted pack there, or "
            if os.path.isdir(os.path.join(dst, STATE_DIR))
            else ""
        )
        raise PackError(f"destination {dst} is not empty; {hint}choose an empty or new folder")
    if os.path.exists(dst) and not os.path.isdir(dst):
        raise PackError(f"destination {dst} is a file; choose a folder")
    os.makedirs(dst, exist_ok=True)
    journal.start(plan.fingerprint, len(plan.shards))
    return {}


def _kept_shards(dst: str, journal: PackJournal, plan: _Plan) -> dict[int, ShardResult]:
    kept: dict[int, ShardResult] = {}
    names = {p.number: p.name for p in plan.shards}
    for number, record in journal.finished().items():
        entry = ShardEntry.from_dict(record["entry"])
        if names.get(number) != entry.name:
            continue
        try:
            size = os.path.getsize(os.path.join(dst, entry.name))
        except OSError:
            continue
        if size == entry.bytes:
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
    dst: str,
    journal: PackJournal,
    results: dict[int, ShardResult],
    advance: Callable[[int, int], None],
) -> None:
    def one(shard: ShardPlan) -> ShardResult:
        tmp = os.path.join(journal.tmp_dir, f"{shard.number:06d}.part")
        samples = plan.samples[shard.start : shard.stop]
        if config.shard_format == "tar":
            result = write_tar_shard(shard.name, samples, tmp, fsync=config.fsync, on_sample=advance)
        else:
            result = write_parquet_shard(
                shard.name,
                samples,
                tmp,
                fields=plan.fields,
                row_group_bytes=config.row_group_bytes,
                compression=config.compression,
                on_sample=advance,
            )
        result.entry.partition = shard.partition
        publish(tmp, os.path.join(dst, shard.name))
        return result

    with ThreadPoolExecutor(max_workers=min(config.worker_count, max(1, len(todo)))) as pool:
        futures: dict[Future[ShardResult], ShardPlan] = {pool.submit(one, s): s for s in todo}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for fut in finished:
                if fut.exception() is not None:
                    for other in pending:
                        other.cancel()
                    raise fut.exception()  # type: ignore[misc]
                shard = futures[fut]
                result = fut.result()
                results[shard.number] = result
                journal.record(
                    {
                        "number": shard.number,
                        "entry": result.entry.to_dict(),
                        "skipped": [{"path": s.path, "reason": s.reason} for s in result.skipped],
                        "payload_bytes": result.payload_bytes,
                        "files": result.files,
                    },
                    fsync=config.fsync,
                )
