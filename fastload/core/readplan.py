"""Planning a worker's reads: its sample references, in order, grouped into read tasks.

A task is one read of one shard: a run of consecutive samples of a tar (or TFRecord) shard, read as one byte
range from the index offsets and capped at ``max_task_bytes`` so prefetch stays fine-grained; or the rows of
a Parquet shard wanted in a row, read by row group. Tasks keep the order of the references exactly, so the
samples they return, concatenated, are the references' samples in order.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from fastload.core.index import ShardEntry


@dataclass(frozen=True)
class ReadTask:
    """Read ``positions`` (index positions, in delivery order) of shard number ``shard``; ~``nbytes``."""

    shard: int
    positions: tuple[int, ...]
    nbytes: int


def _row_group_starts(entry: ShardEntry) -> list[int]:
    starts = [0]
    for rg in entry.row_groups:
        starts.append(starts[-1] + rg[2])
    return starts


def plan_reads(
    refs: Sequence[tuple[int, int]], shards: Sequence[ShardEntry], *, max_task_bytes: int
) -> list[ReadTask]:
    """Read tasks covering ``refs`` (``(shard, position)`` pairs) in order.

    With byte offsets (tar), a task is a run of ascending consecutive positions of one shard whose byte
    range stays within ``max_task_bytes`` (a single larger sample gets a task of its own). Without offsets
    (Parquet), a task is a maximal group of consecutive references to one shard.
    """
    if max_task_bytes < 1:
        raise ValueError(f"max_task_bytes={max_task_bytes} must be >= 1")
    tasks: list[ReadTask] = []
    i = 0
    while i < len(refs):
        shard, first = refs[i]
        entry = shards[shard]
        if entry.offsets:
            end = first + 1
            nbytes = entry.sizes[first]
            j = i + 1
            while j < len(refs) and refs[j] == (shard, end):
                size = entry.sizes[end]
                if nbytes + size > max_task_bytes:
                    break
                nbytes += size
                end += 1
                j += 1
            tasks.append(ReadTask(shard, tuple(range(first, end)), nbytes))
        else:
            starts = _row_group_starts(entry)
            groups: set[int] = set()
            nbytes = 0
            j = i
            while j < len(refs) and refs[j][0] == shard:
                g = bisect.bisect_right(starts, refs[j][1]) - 1
                if g not in groups:
                    size = entry.row_groups[g][1] if 0 <= g < len(entry.row_groups) else 0
                    if groups and nbytes + size > max_task_bytes:
                        break
                    groups.add(g)
                    nbytes += size
                j += 1
            tasks.append(ReadTask(shard, tuple(p for _, p in refs[i:j]), nbytes))
        i = j
    return tasks


def runs(positions: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive ascending positions grouped as ``(first, last + 1)`` runs, in the given order."""
    out: list[tuple[int, int]] = []
    for p in positions:
        if out and out[-1][1] == p:
            out[-1] = (out[-1][0], p + 1)
        else:
            out.append((p, p + 1))
    return out
