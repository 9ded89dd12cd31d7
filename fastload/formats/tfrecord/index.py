"""Indexes of TFRecord files that were not written by ``fastload pack``: each file read once, front to back
(both CRCs of every record, each record's byte range and key), in parallel."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from fastload.config import S3Config
from fastload.core.index import DatasetIndex, ShardEntry
from fastload.errors import ConfigError, FastloadError, VerifyError
from fastload.formats.shard import ChecksumReader
from fastload.formats.tfrecord.codec import is_tfrecord_name
from fastload.formats.tfrecord.reader import scan
from fastload.storage import access as storage


def _scan_one(
    url: str, name: str, s3_config: S3Config | None
) -> tuple[ShardEntry | None, list[str], int, VerifyError | None]:
    try:
        f = storage.open_read(url, config=s3_config)
    except (OSError, FastloadError) as exc:
        return None, [], 0, VerifyError(f"cannot read the file ({exc})", shard=name)
    with f:
        reader = ChecksumReader(f)
        found = scan(reader, name)
        if found.problem is not None:
            return None, [], 0, found.problem
        reader.drain()
    entry = ShardEntry(
        name=name,
        bytes=reader.pos,
        checksum=f"{reader.crc:08x}",
        keys=found.keys,
        offsets=found.offsets,
        sizes=found.sizes,
    )
    return entry, found.fields, found.payload_bytes, None


def scan_tfrecord_files(
    named: Sequence[tuple[str, str]], *, threads: int, s3_config: S3Config | None
) -> tuple[DatasetIndex, list[VerifyError]]:
    """Scan TFRecord files ``(url, name)`` in parallel: their index (in order) and the problems found."""
    entries: list[ShardEntry] = []
    problems: list[VerifyError] = []
    fields: set[str] = set()
    payload = 0
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(named)))) as pool:
        for entry, names, nbytes, problem in pool.map(lambda x: _scan_one(x[0], x[1], s3_config), named):
            if problem is not None:
                problems.append(problem)
            elif entry is not None:
                entries.append(entry)
                fields.update(names)
                payload += nbytes
    index = DatasetIndex(
        shard_format="tfrecord",
        fields=sorted(fields),
        shards=entries,
        options={"shard_format": "tfrecord", "indexed_by": "fastload index"},
        payload_bytes=payload,
    )
    return index, problems


def index_tfrecord_files(
    urls: Sequence[str], *, config: S3Config | None = None, threads: int = 8
) -> tuple[str, DatasetIndex]:
    """``(root, index)`` for TFRecord files given by URL (all local or all on S3), without writing anything:
    shard names are relative to ``root``. Raises :class:`VerifyError` for the first bad file."""
    from fastload.storage.access import split_root

    if not urls:
        raise ConfigError("no TFRecord files given")
    urls = [storage.normalise(u) for u in urls]
    other = next((u for u in urls if not is_tfrecord_name(u)), None)
    if other is not None:
        raise ConfigError(f"{other} is not a TFRecord file name (*.tfrecord, *.tfrecords, *.tfrec, or .gz)")
    root, names = split_root(urls)
    index, problems = scan_tfrecord_files(
        list(zip(urls, names, strict=True)), threads=threads, s3_config=config
    )
    if problems:
        raise problems[0]
    return root, index
