"""The rows of a shard a filter keeps, as sorted ``[start, stop)`` runs of row positions (a sorted column's
range filter keeps one run per shard; a filter on an unsorted column, at worst one per row), and the map
from a position among the kept rows (what the planner deals out) to the row's position in the shard (what
the reader reads)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

Spans = np.ndarray[Any, np.dtype[np.int64]]  # shape (k, 2): [start, stop) runs, sorted, disjoint


def spans(runs: Iterable[tuple[int, int]]) -> Spans:
    """``runs`` sorted, empty ones dropped, touching or overlapping ones merged."""
    out: list[list[int]] = []
    for start, stop in sorted(r for r in runs if r[1] > r[0]):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], stop)
        else:
            out.append([start, stop])
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def from_mask(mask: Any, offset: int = 0) -> list[tuple[int, int]]:
    """The runs of True in a boolean array, as row positions ``offset + i``."""
    m = np.asarray(mask, dtype=bool)
    edges = np.flatnonzero(np.diff(np.concatenate(([False], m, [False])).astype(np.int8)))
    return [(offset + int(a), offset + int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def count(s: Spans) -> int:
    return int((s[:, 1] - s[:, 0]).sum())


def rows_at(s: Spans, positions: Any) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The shard rows of the kept rows at ``positions`` (0 <= position < :func:`count`)."""
    pos = np.asarray(positions, dtype=np.int64)
    lengths = s[:, 1] - s[:, 0]
    begins = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    k = np.searchsorted(begins, pos, side="right") - 1
    return s[k, 0] + (pos - begins[k])  # type: ignore[no-any-return]
