"""``fastload index``: write ``index.json`` for a folder or ``s3://`` prefix of existing TFRecord files,
Parquet files (read from their footers: :mod:`fastload.formats.parquet.foreign`) or WebDataset tar files, so
``ShardDataset`` can split, shuffle and resume them by sample as it does packed shards, without reading them
first in every process.

Every file named ``*.tfrecord``, ``*.tfrecords`` or ``*.tfrec`` (or one of those plus ``.gz``) under the
target is read once, front to back: both CRCs of every record, each record's byte range and key (its
``__key__`` feature, else ``<file stem>/<record index:06d>``), the feature names and the file's CRC32C.
A folder without TFRecord files is indexed as tar shards (:mod:`fastload.formats.tar.index`; with the
CRC32C of each sample's bytes, from the same read). Each file's format is found through the registry
(:func:`fastload.formats.foreign_format`), and the format builds the index (:meth:`ShardFormat.table`).

The index is v2: each file's sample table in a ``<file>.fltable`` sidecar next to it, then ``index.json``,
written only when every file reads cleanly; for Parquet files both in ``_fastload/``
(``_fastload/index.json``, ``_fastload/<file>.fltable``), where pandas, pyarrow.dataset, Spark and DuckDB
do not look. Replacing an index (``force``) deletes the sidecars of files the new one no longer lists.
``fastload index --upgrade`` (:mod:`fastload.packing.upgrade`) turns a v1 index into v2 in place.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from fastload import formats
from fastload.config import S3Config
from fastload.core.index import DatasetIndex
from fastload.errors import ConfigError, FastloadError, NotFoundError, VerifyError
from fastload.packing.upgrade import remove_stale_tables, write_v2
from fastload.storage import access as storage
from fastload.storage.manifest import has_index, load_index, refuse_unfinished
from fastload.storage.urls import check_writable

STATE_DIR = ".fastload-index"


@dataclass
class IndexReport:
    """What ``fastload index`` found; ``index`` is None when a file was bad (nothing was written)."""

    target: str
    index: DatasetIndex | None = None
    problems: list[VerifyError] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        if self.index is not None:
            idx = self.index
            where = storage.join(self.target, formats.index_name(idx.shard_format))
            kind = formats.by_name(idx.shard_format).label
            return (
                f"indexed {idx.samples:,} samples in {len(idx.shards)} {kind} file(s) "
                f"({idx.bytes:,} bytes) in {self.seconds:.1f}s; wrote {where}\n"
                f"fields: {', '.join(idx.fields) or '(none)'}"
            )
        head = f"FAILED: {len(self.problems)} bad file(s); no index written."
        lines = [f"{head} First: {self.problems[0]}"]
        lines += [f"  {p}" for p in self.problems[1:20]]
        if len(self.problems) > 20:
            lines.append(f"  ... and {len(self.problems) - 20} more")
        return "\n".join(lines)


def _relative(root: str, url: str) -> str:
    if storage.is_remote(root):
        return url[len(root.rstrip("/")) + 1 :]
    return os.path.relpath(url, root).replace(os.sep, "/")


def _hidden(name: str) -> bool:
    return any(part.startswith(".") for part in name.split("/"))


def build_index(
    target: str | os.PathLike[str],
    *,
    workers: int | None = None,
    force: bool = False,
    s3_config: S3Config | None = None,
    key_column: str | None = None,
) -> IndexReport:
    """Write ``index.json`` for the TFRecord files (or, if it holds none, the WebDataset tar files) under
    ``target``, a folder or ``s3://`` prefix.

    Refuses (:class:`ConfigError`) to replace an existing ``index.json`` unless ``force``. Files in hidden
    folders (a name starting with ``.``) are left out. Parquet files (from other tools: pandas, Spark, DuckDB,
    hive folders) are indexed from their footers (:mod:`fastload.formats.parquet.foreign`), ``key_column``
    naming the column of their keys. Returns a report; when any file is corrupt its problems are listed and
    no index is written.
    """
    began = time.monotonic()
    check_writable(os.fspath(target))  # the index is written there
    root = storage.normalise(target)
    if storage.is_remote(root):
        s3_config = s3_config or S3Config.from_env()
    elif not os.path.exists(root):
        raise NotFoundError(f"{root} does not exist; give the folder holding the TFRecord files", path=root)
    elif not os.path.isdir(root):
        raise ConfigError(f"{root} is a file; give the folder (or s3:// prefix) holding the TFRecord files")
    if not force and has_index(root, s3_config=s3_config):
        raise ConfigError(
            f"{root} has an index.json already; pass --force (force=True) to replace it, "
            "or --upgrade to turn a v1 index into v2"
        )
    refuse_unfinished(root, s3_config=s3_config, what="indexed")
    named = [(u, _relative(root, u)) for u in storage.list_files(root, "", config=s3_config)]
    named = [(u, n) for u, n in named if not _hidden(n)]
    by_format: dict[str, list[tuple[str, str]]] = {}
    for u, n in named:
        fmt = formats.foreign_format(n)
        if fmt is not None:
            by_format.setdefault(fmt.name, []).append((u, n))
    if len(by_format) > 1:
        kinds = " and ".join(formats.by_name(f).label for f in sorted(by_format, reverse=True))
        raise ConfigError(
            f"{root} holds both {kinds} files; one index covers one format: put them in two folders"
        )
    if not by_format:
        tfrecord = formats.by_name("tfrecord")
        kinds = ", ".join(f"*{s}" for s in tfrecord.suffixes)
        raise NotFoundError(
            f"no TFRecord files ({kinds}, or those with .gz), .parquet or .tar files under {root}", path=root
        )
    ((name, files),) = by_format.items()
    report = IndexReport(root)
    threads = workers or min(8, os.cpu_count() or 1)
    if key_column is not None and not formats.by_name(name).keys_from_column:
        raise ConfigError(
            f"--key-column names a Parquet column; {root} holds {formats.by_name(name).label} files"
        )
    if key_column is not None:
        index, report.problems = formats.by_name(name).table(
            files, threads=threads, s3_config=s3_config, key_column=key_column
        )
    else:
        index, report.problems = formats.by_name(name).table(files, threads=threads, s3_config=s3_config)
    report.seconds = time.monotonic() - began
    if report.problems:
        return report
    old = _old_index(root, s3_config) if force else None
    report.index = write_v2(
        root, index, index.shards, state_dir=STATE_DIR, s3_config=s3_config, threads=threads
    )
    if old is not None:
        remove_stale_tables(root, old, report.index, state_dir=STATE_DIR, s3_config=s3_config)
    report.seconds = time.monotonic() - began
    return report


def _old_index(root: str, s3_config: S3Config | None) -> DatasetIndex | None:
    """The index ``force`` replaces, if there is a readable one."""
    try:
        return load_index(root, s3_config=s3_config)
    except (FastloadError, OSError):
        return None
