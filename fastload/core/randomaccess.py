"""Random access arithmetic: global sample numbers to ``(shard, position)`` and the reads a batch needs.

A dataset's samples are numbered shard after shard, in manifest order: sample ``i`` is position
``i - starts[s]`` of the shard ``s`` with ``starts[s] <= i < starts[s + 1]`` (``starts``: the running sum
of the per-shard counts, O(shards), so nothing per sample is needed to find one). The positions a batch
asks of one shard are read in spans (:func:`spans`): runs of neighbouring samples whose byte ranges lie
close enough to be one ranged read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

Int64Array = np.ndarray[Any, np.dtype[np.int64]]


def sample_starts(counts: Sequence[int] | Int64Array) -> Int64Array:
    """``starts`` with ``starts[s]`` the global number of shard ``s``'s first sample and ``starts[-1]``
    the dataset's length (``len(counts) + 1`` entries)."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.asarray(counts, dtype=np.int64), out=out[1:])
    return out


def resolve(indices: Sequence[int] | Int64Array, length: int) -> Int64Array:
    """``indices`` as non-negative sample numbers (negative ones count from the end, as for a list);
    :class:`IndexError` naming the first out of range and the length."""
    try:
        raw = np.asarray(indices)
        if raw.dtype.kind not in "iu" and raw.size:  # (bool, float, object: not indices)
            raise TypeError(raw.dtype)
        idx = raw.astype(np.int64, copy=False).reshape(-1)
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"sample indices must be integers, got {list(indices)[:4]!r}") from None
    out = np.where(idx < 0, idx + length, idx)
    bad = (out < 0) | (out >= length)
    if bad.any():
        first = int(idx[np.argmax(bad)])
        raise IndexError(f"sample index {first} is out of range for a dataset of {length} samples")
    return out


def locate(starts: Int64Array, indices: Int64Array) -> tuple[Int64Array, Int64Array]:
    """``(shard, position in the shard)`` of each of ``indices`` (already :func:`resolve`-d)."""
    shards = np.searchsorted(starts, indices, side="right").astype(np.int64) - 1
    return shards, indices - starts[shards]


def spans(
    positions: Sequence[int], offsets: Sequence[int], sizes: Sequence[int], *, max_gap_bytes: int
) -> list[tuple[int, int]]:
    """Positions of one shard (ascending, distinct) grouped into ``(first, stop)`` spans, each one ranged
    read of the samples ``first..stop-1``: a sample joins the span before it when the bytes between them
    (samples nobody asked for) are at most ``max_gap_bytes`` (0: only adjacent samples join)."""
    out: list[tuple[int, int]] = []
    for p in positions:
        if out:
            first, stop = out[-1]
            end = offsets[stop - 1] + sizes[stop - 1]
            if p == stop or offsets[p] - end <= max_gap_bytes:
                out[-1] = (first, p + 1)
                continue
        out.append((p, p + 1))
    return out


def group_starts(rows: Sequence[int]) -> list[int]:
    """The first position of each row group (Parquet ``rows`` per group), plus the total at the end."""
    starts = [0]
    for n in rows:
        starts.append(starts[-1] + n)
    return starts
