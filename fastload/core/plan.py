"""Shard planning: sample order, shard boundaries and Parquet row groups, decided before any byte is written.

Plans depend only on the listing and the options, never on the number of workers, so the same input
always gives the same shards.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ShardPlan:
    """One shard: samples ``order[start:stop]`` written to ``name`` (relative to the destination)."""

    number: int
    start: int
    stop: int
    name: str
    partition: str | None = None

    @property
    def count(self) -> int:
        return self.stop - self.start


def sample_order(
    n: int, partitions: Sequence[str | None] | None = None, *, seed: int | None = None
) -> list[int]:
    """Positions of key-sorted samples in write order.

    Samples stay grouped by partition (in partition order); within a partition they keep key order, or
    are shuffled with ``random.Random(seed)`` when a seed is given.
    """
    order = list(range(n))
    if partitions is not None:
        if len(partitions) != n:
            raise ValueError(f"{len(partitions)=} must equal {n=}")
        order.sort(key=lambda i: (partitions[i] is not None, partitions[i] or ""))
    if seed is None:
        return order
    rng = random.Random(seed)
    out: list[int] = []
    run_start = 0
    for i in range(1, n + 1):
        if i == n or (partitions is not None and partitions[order[i]] != partitions[order[run_start]]):
            run = order[run_start:i]
            rng.shuffle(run)
            out.extend(run)
            run_start = i
    return out


def plan_shards(
    sizes: Sequence[int],
    partitions: Sequence[str | None] | None = None,
    *,
    shard_bytes: int,
    max_samples: int | None,
    prefix: str,
    suffix: str,
    overhead_bytes: int = 0,
) -> list[ShardPlan]:
    """Cut samples (already in write order) into shards.

    A shard takes samples while its size (``overhead_bytes`` plus the samples' ``sizes``) stays within
    ``shard_bytes`` and its count within ``max_samples``; a single sample larger than ``shard_bytes`` gets a
    shard of its own. A change of partition always starts a new shard. Names are
    ``[partition/]{prefix}-{number:06d}{suffix}``.
    """
    if shard_bytes <= 0:
        raise ValueError(f"{shard_bytes=} must be > 0")
    if max_samples is not None and max_samples <= 0:
        raise ValueError(f"{max_samples=} must be > 0")
    if partitions is not None and len(partitions) != len(sizes):
        raise ValueError(f"{len(partitions)=} must equal {len(sizes)=}")
    plans: list[ShardPlan] = []

    def close(start: int, stop: int) -> None:
        part = partitions[start] if partitions is not None else None
        folder = f"{part}/" if part else ""
        number = len(plans)
        plans.append(ShardPlan(number, start, stop, f"{folder}{prefix}-{number:06d}{suffix}", part))

    start = 0
    used = overhead_bytes
    for i, size in enumerate(sizes):
        if i > start:
            full = used + size > shard_bytes or (max_samples is not None and i - start >= max_samples)
            new_part = partitions is not None and partitions[i] != partitions[start]
            if full or new_part:
                close(start, i)
                start, used = i, overhead_bytes
        used += size
    if start < len(sizes):
        close(start, len(sizes))
    return plans


def plan_row_groups(sizes: Sequence[int], *, row_group_bytes: int) -> list[tuple[int, int]]:
    """``(start, stop)`` sample ranges of a Parquet shard's row groups, each within ``row_group_bytes``
    (a single larger sample gets a row group of its own)."""
    if row_group_bytes <= 0:
        raise ValueError(f"{row_group_bytes=} must be > 0")
    groups: list[tuple[int, int]] = []
    start, used = 0, 0
    for i, size in enumerate(sizes):
        if i > start and used + size > row_group_bytes:
            groups.append((start, i))
            start, used = i, 0
        used += size
    if start < len(sizes):
        groups.append((start, len(sizes)))
    return groups


def parquet_row_bytes(key: str, field_sizes: Sequence[int]) -> int:
    """Upper estimate of the bytes one sample adds to an uncompressed Parquet shard: its data, the key, and
    a 4-byte length plus a definition level per value."""
    return sum(field_sizes) + len(key.encode("utf-8", "surrogateescape")) + 8 + 6 * len(field_sizes)


def parquet_file_overhead(fields: int, row_groups: int) -> int:
    """Upper estimate of a Parquet shard's fixed bytes: magic, footer and schema, and per row group and
    column chunk its metadata and page headers."""
    return 4096 + 64 * fields + row_groups * (fields + 1) * 512
