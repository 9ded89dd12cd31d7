"""``fastload index --upgrade``: turn a v1 dataset (every sample listed in ``index.json``) into v2 (shards
listed; each shard's sample table in a ``<shard>.fltable`` sidecar, :mod:`fastload.core.table`).

Each tar shard is read once, front to back: its whole-file CRC32C is checked against the index (a shard
that changed since it was indexed is refused, nothing is written), and the CRC32C of every sample's byte
range is recorded, so readers can check each sample's bytes on every read. Parquet and TFRecord shards keep
their own checks (page checksums, record CRCs) and are not read. The sidecars are written first and
``index.json`` last, so an interrupted upgrade leaves the v1 index in place and can be run again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import crc32c

from fastload import formats
from fastload.config import S3Config
from fastload.core.index import INDEX_NAME, DatasetIndex, ShardEntry
from fastload.errors import ConfigError, VerifyError
from fastload.packing.dest import destination
from fastload.storage import access as storage
from fastload.storage.tables import split_entry

STATE_DIR = ".fastload-index"
_CHUNK = 8 << 20


def sample_crcs(url: str, entry: ShardEntry, *, s3_config: S3Config | None = None) -> list[int]:
    """CRC32C of each sample's byte range ``[offsets[i], +sizes[i])`` of the shard at ``url``, read once
    front to back, after checking the whole file's CRC32C and size against ``entry`` (:class:`VerifyError`
    naming the shard otherwise)."""
    order = sorted(range(entry.samples), key=entry.offsets.__getitem__)
    crcs = [0] * entry.samples
    whole = pos = 0
    with storage.open_read(url, config=s3_config) as f:

        def take(n: int, crc: int | None) -> int | None:
            nonlocal whole, pos
            while n > 0:
                data = f.read(min(n, _CHUNK))
                if not data:
                    raise VerifyError(
                        f"ends at byte {pos}, the index says {entry.bytes} bytes: re-pack or re-index",
                        shard=entry.name,
                    )
                whole = crc32c.crc32c(data, whole)
                if crc is not None:
                    crc = crc32c.crc32c(data, crc)
                pos += len(data)
                n -= len(data)
            return crc

        for i in order:
            off, size = entry.offsets[i], entry.sizes[i]
            if off < pos:
                raise VerifyError(f"samples overlap at byte {off}: re-index", shard=entry.name, offset=off)
            take(off - pos, None)
            crcs[i] = take(size, 0) or 0
        while data := f.read(_CHUNK):  # the rest after the last sample
            whole = crc32c.crc32c(data, whole)
            pos += len(data)
    if pos != entry.bytes or f"{whole:08x}" != entry.checksum:
        raise VerifyError(
            f"{pos} bytes with CRC32C {whole:08x}, the index says {entry.bytes} bytes with {entry.checksum}: "
            "the shard changed since it was indexed; re-pack it (or `fastload index --force` for foreign "
            "shards) before upgrading",
            shard=entry.name,
        )
    return crcs


def with_crcs(root: str, index: DatasetIndex, *, s3_config: S3Config | None = None) -> list[ShardEntry]:
    """The shards of ``index`` (attached: v1 or in memory) with per-sample CRC32Cs where the format has byte
    ranges to check (tar), read from ``root``."""
    fmt = formats.by_name(index.shard_format)
    out = []
    for entry in index.shards:
        if fmt.name == "tar" and not entry.crcs and entry.samples:
            url = storage.join(root, entry.name)
            entry = ShardEntry(**{**entry.__dict__, "crcs": sample_crcs(url, entry, s3_config=s3_config)})
        out.append(entry)
    return out


def write_v2(
    root: str,
    index: DatasetIndex,
    shards: Sequence[ShardEntry],
    *,
    state_dir: str = STATE_DIR,
    s3_config: S3Config | None = None,
) -> DatasetIndex:
    """Write each attached shard's sidecar under ``root``, then ``index.json`` v2 listing them; returns it."""
    dest = destination(root, state_dir, config=s3_config)
    detached = []
    for entry in shards:
        manifest_entry, data = split_entry(entry, shard_format=index.shard_format)
        assert manifest_entry.table is not None
        dest.write_bytes(manifest_entry.table.name, data)
        detached.append(manifest_entry)
    v2 = DatasetIndex(
        shard_format=index.shard_format,
        fields=index.fields,
        shards=detached,
        options=index.options,
        skipped=index.skipped,
        payload_bytes=index.payload_bytes,
    )
    dest.write_bytes(INDEX_NAME, v2.to_json())
    return v2


def upgrade_index(target: str | os.PathLike[str], *, s3_config: S3Config | None = None) -> DatasetIndex:
    """Upgrade the v1 dataset at ``target`` (folder or ``s3://`` prefix) to index v2 in place; returns the
    new index. :class:`ConfigError` if it is v2 already."""
    root = storage.normalise(target)
    if storage.is_remote(root):
        s3_config = s3_config or S3Config.from_env()
    index = formats.load_index(root, s3_config=s3_config)
    if index.detached:
        raise ConfigError(f"{storage.join(root, INDEX_NAME)} is index v2 already; nothing to upgrade")
    return write_v2(root, index, with_crcs(root, index, s3_config=s3_config), s3_config=s3_config)
