"""Stage breakdown: each stage of loading timed on its own, in one thread, over the same first samples.

- fetch: the bytes arrive (a file read per field, one GET per file, or one ranged read of a run of
  ``batch_size`` consecutive samples of a shard: the reads fastload plans), without any prefetch;
- parse: tar members of those bytes split into samples (nothing to do for separate files);
- decode: :class:`~fastload.bench.pipeline.Decode` on every sample;
- collate: :func:`~fastload.bench.pipeline.collate` per batch;
- to_device: the batch's tensors pinned and copied to the accelerator (None without one).

Seconds per sample of each stage are what one worker spends; prefetch and workers overlap them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from fastload.bench.pipeline import Decode, collate
from fastload.bench.workload import FileSample
from fastload.config import S3Config
from fastload.core.advice import StageTimes
from fastload.storage import access as storage

FETCH_BUDGET_S = 1.5


def _to_device(batches: list[dict[str, Any]], device: str | None) -> float | None:
    import torch

    if device is None or not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    began = time.perf_counter()
    for batch in batches:
        batch["image"].pin_memory().to(device, non_blocking=True)
        batch["label"].pin_memory().to(device, non_blocking=True)
    torch.cuda.synchronize()
    return time.perf_counter() - began


def _finish(
    raws: list[dict[str, Any]],
    fetch_s: float,
    parse_s: float,
    transform: Decode,
    batch: int,
    device: str | None,
) -> dict[str, Any]:
    n = len(raws)
    began = time.perf_counter()
    decoded = [transform(r) for r in raws]
    decode_s = time.perf_counter() - began
    began = time.perf_counter()
    batches = [collate(decoded[i : i + batch]) for i in range(0, n, batch)]
    collate_s = time.perf_counter() - began
    device_s = _to_device(batches, device)
    stages = StageTimes(
        fetch_s=fetch_s / n,
        parse_s=parse_s / n,
        decode_s=decode_s / n,
        collate_s=collate_s / n,
        to_device_s=None if device_s is None else device_s / n,
    )
    return {"samples": n, "stages": stages}


def per_file(
    samples: list[FileSample],
    root: str,
    *,
    config: S3Config | None,
    count: int,
    transform: Decode,
    batch: int,
    device: str | None,
) -> dict[str, Any]:
    """Stage times of separate files under ``root`` (folder or ``s3://`` prefix)."""
    read: Callable[[str], bytes]
    if storage.is_remote(root):
        from fastload.s3.client import get_client, parse_s3_url

        bucket, prefix = parse_s3_url(root + "/")
        client = get_client(config or S3Config())

        def read(rel: str) -> bytes:
            body = client.get_object(Bucket=bucket, Key=prefix + rel)["Body"]
            try:
                return bytes(body.read())
            finally:
                body.close()

    else:

        def read(rel: str) -> bytes:
            with open(os.path.join(root, rel), "rb") as f:
                return f.read()

    raws: list[dict[str, Any]] = []
    began = time.perf_counter()
    for s in samples[:count]:
        raw: dict[str, Any] = {"__key__": s.key}
        for name, rel in s.members:
            raw[name] = read(rel)
        raws.append(raw)
        if time.perf_counter() - began > FETCH_BUDGET_S and len(raws) >= batch:
            break
    fetch_s = time.perf_counter() - began
    return _finish(raws, fetch_s, 0.0, transform, batch, device)


def packed(
    url: str,
    *,
    config: S3Config | None,
    count: int,
    transform: Decode,
    batch: int,
    device: str | None,
) -> dict[str, Any] | None:
    """Stage times of a packed tar dataset (None for Parquet, whose reads are whole row groups)."""
    from fastload import formats
    from fastload.formats.tar.reader import group_members, parse_tar_fragment
    from fastload.storage.manifest import load_index

    index = load_index(url, s3_config=config)
    if index.shard_format != "tar":
        return None
    runs: list[tuple[str, int, int]] = []  # (shard name, offset, size)
    left = count
    dataset = formats.DatasetEntries(url, index, s3_config=config)
    for i in range(len(index.shards)):
        if left <= 0:
            break
        # (an index v2 shard's offsets are in its sample table, fetched for the shards used only)
        entry = dataset.entry(i)
        for first in range(0, entry.samples, batch):
            if left <= 0:
                break
            stop = min(first + batch, entry.samples, first + left)
            offset = entry.offsets[first]
            end = entry.offsets[stop - 1] + entry.sizes[stop - 1]
            runs.append((entry.name, offset, end - offset))
            left -= stop - first
    fetched: list[tuple[str, bytes, int]] = []
    began = time.perf_counter()
    files: dict[str, Any] = {}
    try:
        for name, offset, size in runs:
            f = files.get(name)
            if f is None:
                f = files[name] = storage.open_read(storage.join(url, name), config=config)
            fetch_range = getattr(f, "fetch_range", None)
            if fetch_range is not None:
                data = fetch_range(offset, offset + size)
            else:
                f.seek(offset)
                data = f.read(size)
            fetched.append((name, data, offset))
            if time.perf_counter() - began > FETCH_BUDGET_S:
                break
        fetch_s = time.perf_counter() - began
    finally:
        for f in files.values():
            f.close()
    began = time.perf_counter()
    raws = [
        s
        for name, data, offset in fetched
        for s in group_members(parse_tar_fragment(data, shard=name, base=offset))
    ]
    parse_s = time.perf_counter() - began
    return _finish(raws, fetch_s, parse_s, transform, batch, device)
