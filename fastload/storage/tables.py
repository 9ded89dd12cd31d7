"""Per-shard sample tables (index v2) fetched from their sidecars: one read of ``<shard>.fltable`` next to
the shard (a single GET from S3: tables are small), checked against the size and CRC32C the manifest
records, through the shard cache when there is one."""

from __future__ import annotations

import crc32c

from fastload.config import S3Config
from fastload.core.index import ShardEntry, TableRef, attach, detach
from fastload.core.table import decode_table, encode_table, table_name
from fastload.errors import IndexFormatError, NotFoundError
from fastload.storage import access as storage
from fastload.storage.cache import ShardCache


def table_bytes(entry: ShardEntry) -> bytes:
    """The sidecar bytes of an attached entry's sample table."""
    return encode_table(entry.sample_table(), crc=crc32c.crc32c)


def split_entry(entry: ShardEntry, *, shard_format: str) -> tuple[ShardEntry, bytes]:
    """``(manifest entry, sidecar bytes)`` for an attached entry: what a v2 writer stores (the sidecar under
    the dataset folder as ``manifest_entry.table.name``)."""
    data = table_bytes(entry)
    ref = TableRef(table_name(entry.name), len(data), f"{crc32c.crc32c(data):08x}")
    return detach(entry, ref, shard_format=shard_format), data


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
            f"{url}: the sample table of shard {entry.name} is missing; re-run `fastload index "
            f"--upgrade {root}` (or re-pack)",
            path=url,
        ) from None
    if len(data) != ref.bytes or f"{crc32c.crc32c(data):08x}" != ref.checksum:
        raise IndexFormatError(
            f"{url}: {len(data)} bytes with CRC32C {crc32c.crc32c(data):08x}, index.json says {ref.bytes} "
            f"bytes with {ref.checksum}: damaged or from another packing; re-run `fastload index --upgrade` "
            "(or re-pack)"
        )
    # (member_sizes rows come as tuples: tens of thousands of lists per table would reach the cyclic
    # collector's oldest generation and trigger full collections, ~70 ms each once torch is imported)
    return attach(entry, decode_table(data, where=url), where=url)
