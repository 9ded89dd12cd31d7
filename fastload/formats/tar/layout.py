"""The member layout of a tar shard's samples: the tar format's own per-shard data in the index (its
payload, :class:`TarLayout`). When every member has one plain 512-byte ustar header, a sample's byte size is
the sum of its members' header + padded data, which readers use to read members' bytes without parsing
every header. Stored as ``fields`` (index.json v2, and the sample table's header) and the table's
``member_sizes`` column (u64, one row of data sizes per sample, in ``fields`` order); index v1 lists
``member_fields`` and ``member_sizes`` in the manifest. These checks keep a layout honest."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.core.index import ShardEntry
from fastload.core.payload import ShardPayload
from fastload.formats.tar.header import BLOCK


@dataclass(frozen=True)
class TarLayout:
    """A tar shard's member layout: the fields every sample has, in member order, and each sample's data
    sizes in that order (tuples when read from a sample table)."""

    fields: list[str]
    sizes: Sequence[Sequence[int]]

    def manifest(self, *, listed: bool) -> dict[str, Any]:
        if listed:
            return {"member_fields": list(self.fields), "member_sizes": [list(r) for r in self.sizes]}
        return {"fields": list(self.fields)}

    def table(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        rows = np.asarray(self.sizes, dtype="<u8").reshape(len(self.sizes), len(self.fields))
        return {"fields": list(self.fields)}, {"member_sizes": rows}

    def nbytes(self) -> int:
        return 64 * len(self.fields) + len(self.sizes) * (56 + 8 * len(self.fields))

    def slim(self) -> ShardPayload | None:
        return self  # (what makes the shard's reads fast; read again only by scanning the whole shard)


def layout_of(entry: ShardEntry) -> TarLayout | None:
    """The member layout of ``entry``, if its index has one."""
    payload = entry.payload
    return payload if isinstance(payload, TarLayout) else None


def plain_member_bytes(size: int) -> int:
    """Bytes a member of ``size`` data bytes takes in a tar shard with one plain 512-byte header."""
    return BLOCK + -(-size // BLOCK) * BLOCK


def layout_problem(layout: TarLayout, entry: ShardEntry) -> str | None:
    """Why ``layout`` cannot describe ``entry``'s tar shard, or None when it is consistent.

    The layout is written only for shards whose members all carry one plain 512-byte ustar header, so each
    sample's byte size must be the sum of its members' header + padded data.
    """
    if not layout.fields:
        return "member_sizes without member_fields"
    if len(set(layout.fields)) != len(layout.fields):
        return "member_fields has duplicates"
    if not entry.offsets or len(layout.sizes) != entry.samples:
        return "needs offsets and one member_sizes row per sample"
    width = len(layout.fields)
    for i, (row, size) in enumerate(zip(layout.sizes, entry.sizes, strict=True)):
        if len(row) != width or sum(plain_member_bytes(s) for s in row) != size or min(row) < 0:
            return f"row {i} ({list(row)}) does not add up to the sample's {size} bytes"
    return None


def set_layout(entry: ShardEntry, layouts: Sequence[tuple[Sequence[str], list[int]] | None]) -> None:
    """Record a tar shard's member layout as ``entry``'s payload from each sample's ``(fields, data sizes)``
    (None for a sample with a member that is not one plain 512-byte header + data), when every sample has
    the same fields in the same order and the layout adds up (:func:`layout_problem`); otherwise none."""
    entry.payload = None
    if not layouts or len(layouts) != entry.samples:
        return
    first = layouts[0]
    if first is None or not first[0]:
        return
    fields = list(first[0])
    rows: list[list[int]] = []
    for lay in layouts:
        if lay is None or list(lay[0]) != fields:
            return
        rows.append(lay[1])
    layout = TarLayout(fields, rows)
    if layout_problem(layout, entry) is None:
        entry.payload = layout


def _rows(sizes: np.ndarray) -> list[Any]:
    """The member sizes as one tuple per sample, made column-wise (tuples of ints leave the cyclic
    collector's care at its next young collection; lists would reach its oldest generation: tens of
    thousands of lists per table would trigger full collections, ~70 ms each once torch is imported)."""
    if sizes.shape[1] == 0:
        return [()] * len(sizes)
    return list(zip(*(sizes[:, k].tolist() for k in range(sizes.shape[1])), strict=True))


def _array_problem(fields: list[str], rows: np.ndarray, sizes: np.ndarray | None, samples: int) -> str | None:
    """:func:`layout_problem` over a decoded table's numpy columns (one pass per column, no per-row loop)."""
    if rows.ndim != 2 or rows.shape[1] != len(fields):
        return "member_sizes rows do not match fields"
    if sizes is None or rows.shape[0] != samples:
        return "needs offsets and one member_sizes row per sample"
    if not fields:
        return "member_sizes without member_fields"
    if len(set(fields)) != len(fields):
        return "member_fields has duplicates"
    block = np.uint64(BLOCK)
    spans = (block + (rows + block - np.uint64(1)) // block * block).sum(axis=1, dtype=np.uint64)
    bad = np.flatnonzero(spans != sizes)
    if bad.size:
        i = int(bad[0])
        return f"row {i} ({rows[i].tolist()}) does not add up to the sample's {int(sizes[i])} bytes"
    return None


def read_layout(entry: ShardEntry) -> TarLayout | None:
    """The member layout of ``entry`` as stored (``ShardFormat.read_payload`` of tar): the sample table's
    ``fields`` and ``member_sizes`` (checked against index.json's ``fields`` and the sample sizes), or a v1
    manifest's ``member_fields`` and ``member_sizes``; None where the index has none. Raises
    :class:`ValueError` saying what does not fit."""
    stored, extra = entry.table_extra, entry.extra
    if stored is not None and "member_sizes" in stored.columns:
        fields = [str(f) for f in stored.header.get("fields", [])]
        listed = [str(f) for f in extra.get("fields", [])]
        if fields != listed:
            raise ValueError(f"the sample table's fields {fields} differ from index.json's {listed}")
        rows = stored.columns["member_sizes"]
        problem = _array_problem(fields, rows, stored.arrays.get("sizes"), entry.samples)
        if problem is not None:
            raise ValueError(f"member layout: {problem}")
        return TarLayout(fields, _rows(rows))
    if "member_fields" in extra or "member_sizes" in extra:  # index v1
        try:
            layout = TarLayout(
                [str(f) for f in extra.get("member_fields", [])],
                [[int(x) for x in row] for row in extra.get("member_sizes", [])],
            )
        except (TypeError, ValueError):
            raise ValueError("member layout: member_sizes must be lists of integers") from None
        problem = layout_problem(layout, entry)
        if problem is not None:
            raise ValueError(f"member layout: {problem}")
        return layout
    return None
