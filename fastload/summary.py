"""``fastload inspect``: what a dataset index holds, in words, and the samples of one shard (of an index v2,
from that shard's sample table only)."""

from __future__ import annotations

import os
from collections import Counter

from fastload.config import S3Config
from fastload.core.index import DatasetIndex
from fastload.core.units import format_size
from fastload.core.versions import versions_of
from fastload.errors import ConfigError
from fastload.formats import DatasetEntries, by_name, sidecar_prefix


def describe(index: DatasetIndex) -> str:
    """Summary: shards, samples, bytes, fields, and a histogram of shard sizes."""
    version = (
        "v2 (shards listed; each shard's sample table in "
        f"{sidecar_prefix(index.shard_format)}<shard>.fltable)"
        if index.detached
        else "v1 (every sample listed in index.json; `fastload index --upgrade` writes v2)"
    )
    lines = [
        f"index:    {version}",
        f"format:   {index.shard_format} (checksum crc32c)",
        f"shards:   {len(index.shards):,}",
        f"samples:  {index.samples:,}",
        f"bytes:    {format_size(index.bytes)} ({index.bytes:,}); payload {format_size(index.payload_bytes)}",
        f"fields:   {', '.join(index.fields)}",
    ]
    fields = Counter(k for s in index.shards for k in ([s.partition] if s.partition else []))
    if fields:
        lines.append("partitions: " + ", ".join(f"{p} ({n} shards)" for p, n in sorted(fields.items())))
    versions = versions_of(index)
    if len(versions) > 1:
        lines.append(
            f"versions: {len(versions)} (newest {versions[-1].created}; `fastload inspect --versions`)"
        )
    if index.skipped:
        lines.append(f"skipped:  {len(index.skipped)} input(s) when packing (see index.json)")
    lines += by_name(index.shard_format).describe(index)  # what only this format has to say
    if index.shards:
        sizes = [s.bytes for s in index.shards]
        lo, hi = min(sizes), max(sizes)
        lines.append(
            f"shard size: min {format_size(lo)}, median {format_size(sorted(sizes)[len(sizes) // 2])}, "
            f"max {format_size(hi)}"
        )
        bins = 8
        width = max(1, (hi - lo) / bins)
        counts = Counter(min(bins - 1, int((s - lo) / width)) for s in sizes)
        top = max(counts.values())
        for b in range(bins if hi > lo else 1):
            left = lo + b * width
            bar = "#" * round(30 * counts.get(b, 0) / top)
            lines.append(
                f"  {format_size(left):>10} .. {format_size(left + width):>10} | {bar} {counts.get(b, 0)}"
            )
    return "\n".join(lines)


def describe_versions(index: DatasetIndex) -> str:
    """One line per version: number, time, shards added, and the dataset's totals at that version (an index
    without recorded versions is version 1 of every shard)."""
    lines = [f"{'version':>7}  {'created (UTC)':<20}  {'added':>7}  {'shards':>7}  {'samples':>12}  bytes"]
    for v in versions_of(index):
        created = v.created or "(not recorded)"
        lines.append(
            f"{v.version:>7}  {created:<20}  {v.added:>7,}  {v.shards:>7,}  {v.samples:>12,}  "
            f"{format_size(v.bytes)} ({v.bytes:,})"
        )
    return "\n".join(lines)


def list_shard(
    index: DatasetIndex,
    shard: str,
    *,
    limit: int | None = None,
    root: str | None = None,
    s3_config: S3Config | None = None,
) -> str:
    """One line per sample of ``shard`` (its name, or its position in the index); of an index v2 its sample
    table is read from ``root`` (the dataset's folder or prefix), no other shard's."""
    names = (i for i, s in enumerate(index.shards) if s.name == shard or os.path.basename(s.name) == shard)
    i = next(names, None)
    if i is None and shard.isdigit() and int(shard) < len(index.shards):
        i = int(shard)
    if i is None:
        raise ConfigError(
            f"no shard {shard!r} in the index; give a shard name or a number below {len(index.shards)}"
        )
    entry = index.shards[i]
    if entry.detached:
        if root is None:
            raise ConfigError(f"shard {entry.name}: its sample table is a sidecar; give the dataset's root")
        entry = DatasetEntries(root, index, s3_config=s3_config).entry(i)
    lines = [f"{entry.name}: {entry.samples} samples, {entry.bytes:,} bytes, crc32c {entry.checksum}"]
    rows = entry.keys if limit is None else entry.keys[:limit]
    for i, key in enumerate(rows):
        if entry.offsets:
            crc = f"  crc32c {entry.crcs[i]:08x}" if entry.crcs else ""
            lines.append(f"  {i:6d}  {key}  offset {entry.offsets[i]}  size {entry.sizes[i]}{crc}")
        else:
            lines.append(f"  {i:6d}  {key}")
    if limit is not None and entry.samples > limit:
        lines.append(f"  ... {entry.samples - limit} more (use --limit 0 for all)")
    return "\n".join(lines)


def describe_file(url: str, *, limit: int | None = None, s3_config: S3Config | None = None) -> str:
    """``fastload inspect`` of one shard file or S3 object (normalised ``url``): its samples, from the
    sample table of the dataset whose ``index.json`` lists it; without one, from the file read once."""
    from fastload.formats import index_files
    from fastload.storage.manifest import dataset_of_file

    found = dataset_of_file(url, s3_config=s3_config)
    if found is not None:
        root, index, entry = found
        head = f"shard of the dataset {root} ({index.shard_format}; `fastload inspect {root}` for all of it)"
        return head + "\n" + list_shard(index, entry.name, limit=limit, root=root, s3_config=s3_config)
    root, index = index_files([url], s3_config=s3_config)
    head = "no index.json lists this file: its samples were found by reading it once"
    return head + "\n" + list_shard(index, index.shards[0].name, limit=limit, root=root, s3_config=s3_config)
