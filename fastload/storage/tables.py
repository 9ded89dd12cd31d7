"""Per-shard sample tables (index v2) fetched from their sidecars: one read of ``<shard>.fltable`` next to
the shard (a single GET from S3: tables are small), checked against the size, CRC32C and content checksum
the manifest records (:func:`table_problem`), through the shard cache when there is one."""

from __future__ import annotations

import crc32c

from fastload.config import S3Config
from fastload.core.index import ShardEntry, TableRef, attach, detach
from fastload.core.table import content_crc, decode_table, encode_table, table_name
from fastload.errors import IndexFormatError, NotFoundError
from fastload.storage import access as storage
from fastload.storage.cache import ShardCache


def table_bytes(entry: ShardEntry) -> bytes:
    """The sidecar bytes of an attached entry's sample table."""
    return encode_table(entry.sample_table(), crc=crc32c.crc32c)


def split_entry(entry: ShardEntry, *, shard_format: str, prefix: str = "") -> tuple[ShardEntry, bytes]:
    """``(manifest entry, sidecar bytes)`` for an attached entry: what a v2 writer stores (the sidecar under
    the dataset folder as ``manifest_entry.table.name``: ``prefix`` + ``<shard>.fltable``, the prefix
    ``fastload.formats.sidecar_prefix`` gives for the format)."""
    data = table_bytes(entry)
    ref = table_ref(prefix + table_name(entry.name), data)
    return detach(entry, ref, shard_format=shard_format), data


INCOMPLETE_COPY = (
    "a likely cause is an incomplete copy of the dataset (interrupted, or made by a tool that copies "
    "index.json before the shards: `fastload cp -r` copies it last, so an unfinished copy has none)"
)


def missing_shard(url: str, name: str) -> NotFoundError:
    """The error for shard ``name`` of a dataset's index not found at ``url``."""
    return NotFoundError(
        f"{url}: shard {name}, listed in the dataset's index, is missing; {INCOMPLETE_COPY}: copy the "
        "dataset again whole; else it was deleted or moved since the dataset was written: restore it, or "
        "re-pack (`fastload verify` checks every shard)",
        path=url,
    )


def table_ref(name: str, data: bytes) -> TableRef:
    """What the manifest records of the table ``data`` stored as ``name``."""
    return TableRef(name, len(data), f"{crc32c.crc32c(data):08x}", f"{content_crc(data):08x}")


def table_problem(data: bytes, ref: TableRef, *, url: str, shard: str, root: str = "DATASET") -> str | None:
    """Why the bytes ``data`` read from ``url`` are not the sample table ``ref`` of ``shard`` (damaged,
    truncated, or a stale table of another pack: a different content checksum), or None when they are.
    An index written before ``content`` was recorded can tell damage only (``fastload index --upgrade``
    records it). ``root``: the dataset, for the command the message gives."""
    whole = crc32c.crc32c(data)
    fix = (
        f"run `fastload index --upgrade {root}` (it rebuilds the table from the shard), or copy the dataset "
        "again whole (`fastload cp -r` copies index.json last)"
    )
    if len(data) != ref.bytes or f"{whole:08x}" != ref.checksum:
        return (
            f"{url}: the sample table of shard {shard} is damaged or truncated ({len(data)} bytes with "
            f"CRC32C {whole:08x}, index.json says {ref.bytes} bytes with {ref.checksum}); {fix}"
        )
    if ref.content is not None and f"{content_crc(data):08x}" != ref.content:
        return (
            f"{url}: stale sample table of shard {shard}: its content checksum is {content_crc(data):08x}, "
            f"index.json records {ref.content}, so it was written with another pack or version of this "
            f"dataset (the shard itself may be intact); {fix}"
        )
    return None


def fetch_table(
    root: str, entry: ShardEntry, *, s3_config: S3Config | None = None, cache: ShardCache | None = None
) -> ShardEntry:
    """The full (attached) entry of ``entry``: itself when attached already (v1 manifests, in-memory
    indexes); else its sample table read from the sidecar and checked. Raises :class:`NotFoundError` or
    :class:`IndexFormatError` naming the sidecar and what to do."""
    if not entry.detached:
        return entry
    ref = entry.table
    if ref is None:
        raise IndexFormatError(f"{root}: shard {entry.name} has no sample table; re-run `fastload index`")
    url = storage.join(root, ref.name)
    try:
        pseudo = ShardEntry(name=ref.name, bytes=ref.bytes, checksum=ref.checksum, keys=[])
        cached = cache.try_open(url, pseudo) if cache is not None and storage.is_remote(url) else None
        if cached is not None:
            with cached as f:
                data = f.read()
        else:  # (None from the cache: its folder cannot hold the table)
            data = storage.read_bytes(url, config=s3_config)
    except (NotFoundError, FileNotFoundError):
        raise NotFoundError(
            f"{url}: the sample table of shard {entry.name} is missing; {INCOMPLETE_COPY}: copy the dataset "
            f"again whole; else run `fastload index --upgrade {root}` (it rebuilds the table from the shard)",
            path=url,
        ) from None
    problem = table_problem(data, ref, url=url, shard=entry.name, root=root)
    if problem is not None:
        raise IndexFormatError(problem)
    # (the format's part of the table is read by the format: fastload.formats.read_payload)
    return attach(entry, decode_table(data, where=url), where=url)
