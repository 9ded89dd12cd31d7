"""``fastload index --upgrade``: turn a v1 dataset (every sample listed in ``index.json``) into v2 (shards
listed; each shard's sample table in a ``<shard>.fltable`` sidecar, :mod:`fastload.core.table`).

Each tar shard is read once, front to back: its whole-file CRC32C is checked against the index (a shard
that changed since it was indexed is refused, nothing is written), and the CRC32C of every sample's byte
range is recorded, so readers can check each sample's bytes on every read. Parquet and TFRecord shards keep
their own checks (page checksums, record CRCs) and are not read. Shards are read, then their sidecars
written, several at a time; ``index.json`` last, so an interrupted upgrade (or a refused shard: nothing is
written then) leaves the v1 index in place and can be run again.

On a v2 dataset it repairs sample tables (:func:`refresh_tables`): a table written before its content
checksum was recorded (it may be a stale table of another pack), or one that is missing, damaged or stale,
is rebuilt from its shard (the shard's size and CRC32C checked against ``index.json`` first), then
``index.json`` is written again with every table's content checksum.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import crc32c

from fastload import formats
from fastload.config import S3Config
from fastload.core.index import INDEX_NAME, SIDECAR_DIR, DatasetIndex, ShardEntry, attach
from fastload.core.table import decode_table
from fastload.errors import FastloadError, IndexFormatError, VerifyError
from fastload.formats import index_name, sidecar_prefix, table_path
from fastload.packing.dest import Destination, destination
from fastload.packing.guarded import Put, publish_if_unchanged
from fastload.storage import access as storage
from fastload.storage.manifest import read_manifest
from fastload.storage.tables import split_entry, table_bytes, table_ref

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


def with_crcs(
    root: str, index: DatasetIndex, *, s3_config: S3Config | None = None, threads: int = 8
) -> list[ShardEntry]:
    """The shards of ``index`` (attached: v1 or in memory) with per-sample CRC32Cs where the format has byte
    ranges to check (tar), read from ``root``, ``threads`` shards at a time."""
    fmt = formats.by_name(index.shard_format)

    def one(entry: ShardEntry) -> ShardEntry:
        if fmt.name == "tar" and not entry.crcs and entry.samples:
            url = storage.join(root, entry.name)
            entry = dataclasses.replace(entry, crcs=sample_crcs(url, entry, s3_config=s3_config))
        return entry

    return _parallel(one, index.shards, threads)


def write_v2(
    root: str,
    index: DatasetIndex,
    shards: Sequence[ShardEntry],
    *,
    state_dir: str = STATE_DIR,
    s3_config: S3Config | None = None,
    threads: int = 8,
) -> DatasetIndex:
    """Write each attached shard's sidecar under ``root`` (``threads`` at a time), then ``index.json`` v2
    listing them; returns it."""
    dest = destination(root, state_dir, config=s3_config)

    def one(entry: ShardEntry) -> ShardEntry:
        prefix = sidecar_prefix(index.shard_format)
        manifest_entry, data = split_entry(entry, shard_format=index.shard_format, prefix=prefix)
        assert manifest_entry.table is not None  # (split_entry names it)
        dest.write_bytes(manifest_entry.table.name, data)
        return manifest_entry

    v2 = dataclasses.replace(index, shards=_parallel(one, shards, threads))
    publish_index(dest, v2)
    return v2


def publish_index(dest: Destination, index: DatasetIndex, put: Put | None = None) -> None:
    """Write ``index`` where a dataset of its format keeps it (:func:`fastload.formats.index_name`; with
    ``put(url, data)`` if given: :func:`~fastload.packing.guarded.publish_if_unchanged`) and, when that is
    ``_fastload/index.json`` (Parquet), remove an ``index.json`` at the root left by an older fastload
    (which readers would find first)."""
    name = index_name(index.shard_format)
    if put is None:
        dest.write_bytes(name, index.to_json())
    else:
        put(storage.join(dest.url, name), index.to_json())
    if name != INDEX_NAME:
        dest.remove(INDEX_NAME)


def remove_stale_tables(
    root: str, old: DatasetIndex, new: DatasetIndex, *, state_dir: str, s3_config: S3Config | None = None
) -> int:
    """Delete the sidecars ``old`` (an index being replaced) named that ``new`` does not: a re-index that
    drops shards leaves no sample table behind. Returns how many were deleted."""
    kept = {s.table.name for s in new.shards if s.table is not None}
    stale = sorted({s.table.name for s in old.shards if s.table is not None} - kept)
    dest = destination(root, state_dir, config=s3_config)
    for name in stale:
        dest.remove(name)
    return len(stale)


def rebuilt_table(
    root: str, index: DatasetIndex, entry: ShardEntry, *, s3_config: S3Config | None = None
) -> bytes:
    """The sample table of ``entry`` (a v2 manifest entry) built again from its shard, read once by its
    format (as ``fastload index`` reads foreign files); :class:`VerifyError` naming the shard when the shard
    is not the one ``index.json`` describes (size, CRC32C, sample count, member layout) or its format
    cannot index it."""
    fmt = formats.by_name(entry.format or index.shard_format)
    url = storage.join(root, entry.name)
    if not fmt.foreign:
        raise VerifyError(
            f"its sample table cannot be rebuilt ({fmt.label} shards are indexed only when packed): copy "
            "the dataset again whole, or re-pack",
            shard=entry.name,
        )
    named = [(url, entry.name)]
    key_column = index.options.get("key_column")
    if fmt.keys_from_column and isinstance(key_column, str):
        built, problems = fmt.table(named, threads=1, s3_config=s3_config, key_column=key_column)
    else:
        built, problems = fmt.table(named, threads=1, s3_config=s3_config)
    if problems:
        raise problems[0]
    (full,) = built.shards
    checksum = full.checksum or _whole_crc(url, s3_config)
    changed = (
        "the shard changed since it was packed, so its table cannot be rebuilt; copy the dataset again "
        "whole, or re-pack"
    )
    if (full.bytes, checksum, full.samples) != (entry.bytes, entry.checksum, entry.samples):
        raise VerifyError(
            f"{full.bytes} bytes with CRC32C {checksum}, {full.samples} samples; index.json says "
            f"{entry.bytes} bytes with {entry.checksum}, {entry.samples} samples: {changed}",
            shard=entry.name,
        )
    data = table_bytes(dataclasses.replace(full, name=entry.name, partition=entry.partition))
    try:  # the format's part of the new table must agree with index.json's (tar: the member layout's fields)
        formats.read_payload(fmt, attach(entry, decode_table(data, where=url), where=url), where=url)
    except IndexFormatError as exc:
        raise VerifyError(f"{exc}: {changed}", shard=entry.name) from None
    return data


def _whole_crc(url: str, s3_config: S3Config | None) -> str:
    crc = 0
    with storage.open_read(url, config=s3_config) as f:
        while data := f.read(_CHUNK):
            crc = crc32c.crc32c(data, crc)
    return f"{crc:08x}"


def refresh_tables(
    root: str, index: DatasetIndex, *, s3_config: S3Config | None = None, threads: int = 8
) -> tuple[DatasetIndex, int, int]:
    """``(index, tables rebuilt, tables moved)``: the v2 ``index`` with each shard's table checked, and
    rebuilt from its shard (:func:`rebuilt_table`) where it has no content checksum recorded (an index
    written before there was one: the table may be stale) or is missing, damaged or stale; a good table
    not where this fastload writes tables of the format (:func:`fastload.formats.table_path`: Parquet
    datasets written before ``_fastload/``) is written there. The new tables are written, ``index.json`` is
    not (the caller writes it last, then removes the old tables). A shard that cannot be rebuilt raises
    before any table is written."""
    fmt = index.shard_format
    dataset = formats.DatasetEntries(root, index, s3_config=s3_config)

    def check(i: int) -> tuple[ShardEntry, bytes | None, bool]:
        entry = index.shards[i]
        if entry.table is not None and entry.table.content is not None:
            try:
                full = dataset.entry(i)
            except (OSError, FastloadError):
                pass
            else:
                if entry.table.name == table_path(entry.name, fmt):
                    return entry, None, False
                return entry, table_bytes(full), False
        return entry, rebuilt_table(root, index, entry, s3_config=s3_config), True

    if not index.shards:
        return index, 0, 0
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(index.shards)))) as pool:
        checked = list(pool.map(check, range(len(index.shards))))
    dest = destination(root, STATE_DIR, config=s3_config)
    shards: list[ShardEntry] = []
    for entry, data, _ in checked:
        if data is not None:
            name = table_path(entry.name, fmt)
            dest.write_bytes(name, data)
            entry = dataclasses.replace(entry, table=table_ref(name, data))
        shards.append(entry)
    rebuilt = sum(1 for _, _, again in checked if again)
    moved = sum(1 for _, data, again in checked if data is not None and not again)
    return dataclasses.replace(index, shards=shards), rebuilt, moved


@dataclass
class UpgradeReport:
    """What ``fastload index --upgrade`` did: ``upgraded`` is False when the index was v2 already with
    every sample table checked and its content checksum recorded; ``tables_rebuilt`` on a v2 index."""

    target: str
    index: DatasetIndex
    upgraded: bool = True
    shards_read: int = 0
    tables_rebuilt: int = 0
    moved: int = 0  # sample tables moved into _fastload/ (with index.json: Parquet, older layout)
    seconds: float = 0.0

    def summary(self) -> str:
        where = storage.join(self.target, index_name(self.index.shard_format))
        if not self.upgraded:
            return f"{where} is index v2 already; nothing to upgrade (every sample table intact)"
        if self.tables_rebuilt or self.moved:
            parts = []
            if self.tables_rebuilt:
                parts.append(
                    f"rebuilt {self.tables_rebuilt} sample table(s) from their shards (missing, damaged, "
                    "stale, or written before tables had a content checksum)"
                )
            if self.moved:
                parts.append(
                    f"moved index.json and {self.moved} sample table(s) into {SIDECAR_DIR}/ (where Parquet "
                    "readers do not look)"
                )
            return (
                f"{'; '.join(parts)}; wrote {where} with every table's content checksum, in "
                f"{self.seconds:.1f}s"
            )
        shards = len(self.index.shards)
        return (
            f"upgraded {where} to index v2 ({shards} shard(s), {self.index.samples:,} samples): wrote "
            f"{shards} sample table(s), read {self.shards_read} tar shard(s) for per-sample CRC32C, in "
            f"{self.seconds:.1f}s"
        )


def upgrade_index(
    target: str | os.PathLike[str], *, s3_config: S3Config | None = None, threads: int = 8
) -> UpgradeReport:
    """Upgrade the v1 dataset at ``target`` (folder or ``s3://`` prefix) to index v2 in place, ``threads``
    shards at a time; a v2 dataset is left as it is (``upgraded=False``)."""
    began = time.monotonic()
    root = storage.normalise(target)
    if storage.is_remote(root):
        s3_config = s3_config or S3Config.from_env()
    seen = read_manifest(root, s3_config=s3_config)  # what is rewritten, if no append published meanwhile
    index = formats.load_index(root, s3_config=s3_config)
    if index.detached:
        fresh, rebuilt, moved = refresh_tables(root, index, s3_config=s3_config, threads=threads)
        misplaced = seen is not None and seen[0] != storage.join(root, index_name(index.shard_format))
        if not (rebuilt or moved or misplaced):
            return UpgradeReport(root, index, upgraded=False)
        dest = destination(root, STATE_DIR, config=s3_config)
        publish_if_unchanged(
            root,
            seen,
            lambda put: publish_index(dest, fresh, put),
            what="`fastload index --upgrade`",
            s3_config=s3_config,
        )
        remove_stale_tables(root, index, fresh, state_dir=STATE_DIR, s3_config=s3_config)
        return UpgradeReport(
            root, fresh, tables_rebuilt=rebuilt, moved=moved, seconds=time.monotonic() - began
        )
    shards = with_crcs(root, index, s3_config=s3_config, threads=threads)
    read = sum(1 for old, new in zip(index.shards, shards, strict=True) if new.crcs and not old.crcs)
    v2 = write_v2(root, index, shards, s3_config=s3_config, threads=threads)
    return UpgradeReport(root, v2, shards_read=read, seconds=time.monotonic() - began)


def _parallel(
    fn: Callable[[ShardEntry], ShardEntry], shards: Sequence[ShardEntry], threads: int
) -> list[ShardEntry]:
    if not shards:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(shards)))) as pool:
        return list(pool.map(fn, shards))
