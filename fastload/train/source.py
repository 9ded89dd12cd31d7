"""Where a ``ShardDataset``'s index comes from: the dataset's ``index.json``, or tar, TFRecord or Parquet
files without one, indexed in memory by reading them once (Parquet: their footers), with a warning that
says how to avoid that cost."""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Sequence

from fastload import formats
from fastload.config import S3Config
from fastload.core.index import DatasetIndex
from fastload.core.weburls import expand_braces, has_braces, is_web
from fastload.errors import ConfigError, NotFoundError
from fastload.storage import access as storage

KEPT_FOOTER_BYTES = 64 << 20  # Parquet footers an in-memory index keeps (per process that opens it)


def cap_footers(index: DatasetIndex, limit_bytes: int) -> int:
    """Keep the per-shard data read to index files (their formats' payloads: Parquet's footers, so reads
    and filters do not read them again) in the index's first entries, up to ``limit_bytes`` in all; later
    entries keep their payloads slimmed (:meth:`~fastload.core.index.ShardPayload.slim`: a Parquet file's
    read then reads its footer from its tail once per open, filters plan from it then). Returns the bytes
    kept. An index of 100,000 files with 50 KB footers would otherwise hold 5 GB in every process that
    opens it."""
    kept = 0
    for i, entry in enumerate(index.shards):
        if entry.payload is None:
            continue
        size = entry.payload.nbytes()
        if kept + size > limit_bytes:
            index.shards[i] = dataclasses.replace(entry, payload=entry.payload.slim())
        else:
            kept += size
    return kept


def _is_shard_file(url: str) -> bool:
    """Whether ``url`` names a shard that can be read without an index (tar, TFRecord: the registry says)."""
    return formats.foreign_format(url) is not None


def _is_one_file(url: str, s3_config: S3Config | None) -> bool:
    """Whether ``url``, named like a shard, is one file rather than a folder named so (Spark writes
    ``events.parquet/part-*.parquet``): a local folder, or an S3 prefix holding objects, is a folder."""
    if not _is_shard_file(url):
        return False
    if is_web(url):  # a web server cannot be listed: a URL named like a shard is one
        return True
    if storage.is_remote(url):
        return not storage.list_files(url, "", config=s3_config)
    return not os.path.isdir(url)


def open_index(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    s3_config: S3Config | None = None,
    key_column: str | None = None,
    stacklevel: int = 3,
) -> tuple[str, DatasetIndex]:
    """``(root, index)`` of a dataset: its ``index.json``; or, for tar or TFRecord shards without one (a
    folder or prefix of them, one file, a list of URLs, or a remote brace pattern of them:
    ``https://host/shard-{000000..000099}.tar``), an index built by reading the shards once, with
    a warning that says how to avoid that cost. ``key_column``: the Parquet column that names samples (an
    index.json must have been written with the same one). ``stacklevel``: the warning's, as
    :func:`warnings.warn` takes it (3: the caller of this function's caller)."""
    folder = None  # the folder given, which shard names are relative to (hive partitions are under it)
    if isinstance(source, str) and storage.is_remote(source) and has_braces(source):
        source = expand_braces(source)  # shard-{000000..000099}.tar, as webdataset users give shards
    if isinstance(source, (str, os.PathLike)):
        root = storage.normalise(source)
        if not _is_one_file(root, s3_config):
            try:
                index = formats.load_index(root, s3_config=s3_config)
            except NotFoundError as missing:
                found = storage.list_files(root, "", config=s3_config) if storage.is_folder(root) else []
                urls = [u for u in found if _is_shard_file(u) and "/." not in u[len(root) :]]
                if not urls and storage.is_folder(root):
                    what = f"holds {len(found)} file(s) but" if found else "is empty or missing:"
                    raise NotFoundError(
                        f"{root} {what} no index.json and no tar, TFRecord or Parquet files; check the URL, "
                        "or write a dataset there with `fastload pack` (or `fastload index` for shards)",
                        path=root,
                    ) from None
                if not urls:
                    raise missing from None
                folder = root
                kinds = {formats.foreign_format(u) for u in urls}
                if len(kinds) > 1:
                    labels = " and ".join(f.label for f in formats.all_formats() if f in kinds)
                    raise ConfigError(
                        f"{root} has no index.json and holds both {labels} files; give a list of "
                        "the shards to read, or run `fastload index` on a folder of one kind"
                    ) from None
            else:
                recorded = index.options.get("key_column")
                if key_column is not None and key_column != recorded:
                    raise ConfigError(
                        f"key_column={key_column!r}, but {root}'s index.json took keys from "
                        f"{recorded or 'none of the columns'}; leave key_column out, or re-run "
                        f"`fastload index --force --key-column {key_column}`"
                    )
                return root, index
        else:
            urls = [root]
    else:
        urls = [storage.normalise(u) for u in source]
        if not urls:
            raise ConfigError("the list of shards is empty")
    started = time.monotonic()
    root, index = formats.index_files(urls, s3_config=s3_config, key_column=key_column, root=folder)
    cap_footers(index, KEPT_FOOTER_BYTES)
    seconds = time.monotonic() - started
    read = (
        f"the footers of {len(index.shards)} Parquet file(s) ({index.bytes:,} bytes) were read"
        if index.options.get("read") == "footers"
        else f"{len(index.shards)} {index.shard_format} shard(s) ({index.bytes:,} bytes) were read once"
    )
    fix = (
        "Write the index once with `fastload index` (or pack with `fastload pack`) to skip this."
        if not is_web(root) or root.startswith(("gs://", "az://"))
        else "A web server holds no index fastload can write: to skip this, copy the shards (`fastload cp`) "
        "to a folder or s3:// and run `fastload index` there."
    )
    warnings.warn(
        f"{root}: no index.json, so {read} to index {index.samples:,} samples in memory ({seconds:.1f}s, "
        f"in every process that opens the dataset). {fix}",
        UserWarning,
        stacklevel=stacklevel,
    )
    return root, index
